"""AReaL's own unit tests, vendored (see README.md); a package so that their file names,
which are AReaL's, may repeat names used elsewhere under tests/."""
