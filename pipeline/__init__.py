"""Pipeline options, graph assembly and the command-line entry point."""
