"""Stand-in for the reference harness package of a pypto-lib checkout: it needs pypto's
compiler, so under `pto pypto` it must never be imported (pto serves `golden`)."""

raise ImportError("the checkout's own golden package was imported instead of pto's")
