"""resident-gate's typer commands, one module each; gate/cli.py registers them."""
