import type { SecretPrompt } from "../core/secrets.js";

/**
 * Reads a secret from the terminal without echoing it. Returns undefined when stdin is
 * not a terminal: the core then refuses `NAME=?` with a clear error instead of hanging.
 */
export function terminalSecretPrompt(
  stdin: NodeJS.ReadStream = process.stdin,
  out: NodeJS.WriteStream = process.stderr,
): SecretPrompt | undefined {
  if (!stdin.isTTY) return undefined;
  return (name) =>
    new Promise((resolve, reject) => {
      // Echo off before the prompt appears: anything typed after seeing it stays hidden.
      stdin.setRawMode(true);
      stdin.resume();
      out.write(`${name}: `);
      let value = "";
      const onData = (chunk: Buffer) => {
        for (const ch of chunk.toString("utf8")) {
          if (ch === "\r" || ch === "\n") {
            finish();
            out.write("\n");
            resolve(value);
            return;
          }
          if (ch === "\u0003") {
            finish();
            out.write("\n");
            reject(new Error("cancelled at the secret prompt"));
            return;
          }
          if (ch === "\u007f" || ch === "\b") value = value.slice(0, -1);
          else value += ch;
        }
      };
      const finish = () => {
        stdin.off("data", onData);
        stdin.setRawMode(false);
        stdin.pause();
      };
      stdin.on("data", onData);
    });
}
