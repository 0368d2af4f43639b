from stratamq.cli import main

main()
