from chload.cli import run

run()
