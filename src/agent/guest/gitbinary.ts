/**
 * Git's binary patch format (`GIT binary patch`, as `git diff --binary` writes it), so a
 * diff that changes a binary file still applies with `git apply`: each side is a
 * `literal SIZE` hunk of zlib-deflated bytes in Git's base85, 52 bytes a line, the line's
 * length as its first character (A-Z for 1-26, a-z for 27-52). `git apply` insists on
 * the full blob ids in the `index` line for binary patches; `blobId` computes them.
 */
import { createHash } from "node:crypto";
import { deflateSync } from "node:zlib";

const ALPHABET = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz!#$%&()*+-;<=>?@^_`{|}~";

/** The id Git gives `content` as a blob (SHA-1 object format). */
export function blobId(content: Buffer): string {
  return createHash("sha1").update(`blob ${content.length}\0`).update(content).digest("hex");
}

export const ZERO_ID = "0".repeat(40);

function base85Line(chunk: Buffer): string {
  const len = chunk.length;
  let line = len <= 26 ? String.fromCharCode(64 + len) : String.fromCharCode(70 + len);
  for (let i = 0; i < len; i += 4) {
    let acc = 0;
    for (let j = 0; j < 4; j++) acc = acc * 256 + (i + j < len ? chunk[i + j]! : 0);
    const group: string[] = [];
    for (let k = 0; k < 5; k++) {
      group.unshift(ALPHABET[acc % 85]!);
      acc = Math.floor(acc / 85);
    }
    line += group.join("");
  }
  return line;
}

/** One `literal` hunk: the whole of `content`, deflated and base85-encoded. */
function literal(content: Buffer): string {
  const packed = deflateSync(content);
  const lines = [`literal ${content.length}`];
  for (let i = 0; i < packed.length; i += 52) lines.push(base85Line(packed.subarray(i, i + 52)));
  return `${lines.join("\n")}\n\n`;
}

/** The body after a file's `diff --git` and mode headers: index line, forward and reverse hunks. */
export function binaryBody(before: Buffer | null, after: Buffer | null, sameMode: string | null): string {
  const oldId = before ? blobId(before) : ZERO_ID;
  const newId = after ? blobId(after) : ZERO_ID;
  const index = `index ${oldId}..${newId}${sameMode ? ` ${sameMode}` : ""}\n`;
  return `${index}GIT binary patch\n${literal(after ?? Buffer.alloc(0))}${literal(before ?? Buffer.alloc(0))}`;
}
