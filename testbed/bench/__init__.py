"""The benchmarks, each run as ``python -m testbed.bench.NAME`` (docs/testbed.md lists them): `testbed bench`'s
fan-out (fanout, with sender, figures, floor, nats_peer, netem, everything_on) and one module per measured
room. Nothing is imported here, so a probe runs on a bare Python."""
