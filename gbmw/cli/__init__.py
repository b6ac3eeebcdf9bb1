"""The `gbmw` command: argument parsing and types (main, argument_types), the planning commands — plan, estimate,
compare (planning, compare) — the commands that run or measure — tune, train, profile, validate (running, which
reaches the adapters lazily, inside the command that needs one) — and the tables and figures (report).

The top of the house: it may import every part of gbmw; only `running` imports gbmw.adapters."""
