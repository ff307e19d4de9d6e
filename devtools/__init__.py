"""Dev-only: demo data and the benchmarks. Not part of the installed distribution."""
