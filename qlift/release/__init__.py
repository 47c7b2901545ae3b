"""`qlift release`: the whole release as one declarative, hash-cached, resumable pipeline file."""

from qlift.release.pipeline import StageReport, run_release
from qlift.release.spec import Release, json_schema, load_release

__all__ = ["Release", "StageReport", "json_schema", "load_release", "run_release"]
