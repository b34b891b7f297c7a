# `make demo` (the README's first command): integration/demo/demo.sh, see its header. Pass options with
# DEMO_ARGS, e.g. `make demo DEMO_ARGS=--yes`. Defines only the demo recipe (the top Makefile declares .PHONY).
DEMO_ARGS ?=
demo:
	integration/demo/demo.sh $(DEMO_ARGS)
