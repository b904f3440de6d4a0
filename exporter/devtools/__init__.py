"""Developer tools: not used by a build, never imported by the package at run time."""
