"""Benchmarks (`make bench`): numbers land in bench/results.json, never in timed tests."""
