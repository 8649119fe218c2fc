"""Probes used beside a bench run: ``python3 -m testbed.bench.probes.NAME``, or a directory with a
``sitecustomize.py`` put on PYTHONPATH."""
