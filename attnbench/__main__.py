from attnbench.cli import run

run()
