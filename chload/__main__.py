from chload.cli.main import run

run()
