from rlscale.cli import main

main()
