from musku.entry import main

main()
