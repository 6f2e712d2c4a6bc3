"""asv benchmark suite of tfdata (one ``bench_<area>.py`` per area; shared fixtures in ``common``)."""
