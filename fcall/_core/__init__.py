"""The swap's steps: flatten, plan, build, engine (fcall/README.md)."""
