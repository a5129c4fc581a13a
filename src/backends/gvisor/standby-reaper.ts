/**
 * Entry point run by a standby's watchdog (standby.ts) once the process that made the
 * standby has exited or died: `node standby-reaper.js WORKSPACE_DIR WORKSPACE_ID TOKEN`.
 * Ends the standby if it still is one: its directory still under its standby name (a
 * hand-out renames it to the workspace's sandbox directory, after killing the watchdog,
 * so a handed-out sandbox is never ended here). Its arguments are checked, and it ends
 * nothing but the cgroups and the directory the token names.
 */
import { join } from "node:path";
import { exists } from "../../util/fs.js";
import { detectCgroups } from "../linux/cgroups.js";
import { endStandby, STANDBY_TOKEN, standbyNames } from "./standby.js";

async function main(args: string[]): Promise<void> {
  const [wsDir, id, token] = args;
  if (!wsDir?.startsWith("/") || !id || !/^[A-Za-z0-9_][A-Za-z0-9_.-]{0,100}$/.test(id)) return;
  if (!token || !STANDBY_TOKEN.test(token)) return;
  const spec = { dir: join(wsDir, "sandbox"), workspace_id: id };
  if (!(await exists(standbyNames(spec, token).dir))) return;
  await endStandby(await detectCgroups(), spec, token);
}

main(process.argv.slice(2)).catch((err) => {
  process.stderr.write(`pyro standby reaper: ${(err as Error).message}\n`);
  process.exitCode = 1;
});
