from musku.cli import main

main()
