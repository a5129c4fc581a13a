import { escapeSuite } from "./suite.js";

// Attempts and reasoning: tests/escape/suite.ts, probe.py; counts in docs/backends.md.
escapeSuite("bwrap");
