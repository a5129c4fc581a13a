import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { notFromGit, roundTrip } from "../helpers/git-roundtrip.js";
import type { Scenario } from "./scenarios.js";

/**
 * The Git round trip on every backend (issue 17): a workspace seeded from a dirty
 * checkout has a working `.git`, its diff honours .gitignore and applies with git apply,
 * and `commitWorkspace` writes every kind of change (created, modified, deleted, renamed,
 * executable, binary, symlink, nested) as one commit on a new host branch, with the
 * host's working tree, index, HEAD and other refs exactly as they were.
 */
export const GIT_SCENARIOS: Scenario[] = [
  {
    name: "git: seeded .git works inside; diff honours .gitignore and applies with git apply; commit round-trips every kind of change to a new host branch and nothing else moves",
    run: async (ctx) => {
      const dir = await mkdtemp(join(tmpdir(), "pyro-parity-git-"));
      try {
        await roundTrip(ctx.pyro, join(dir, "repo"), ctx.createOptions);
        await notFromGit(ctx.pyro, join(dir, "plain"), ctx.createOptions);
      } finally {
        await rm(dir, { recursive: true, force: true });
      }
    },
  },
];
