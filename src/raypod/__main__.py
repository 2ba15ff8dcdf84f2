from raypod.cli.main import main

main()
