"""Eval gates below both eval and serve: the gate grammar (``grammar``) and the gate index (``index``) that
`qlift eval` writes and `qlift serve --recipe auto` reads, so serve never imports eval."""
