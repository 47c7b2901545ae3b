from qlift.cli import main

main()
