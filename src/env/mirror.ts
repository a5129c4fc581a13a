import { readdir, readFile } from "node:fs/promises";
import { join } from "node:path";

export const FALLBACK_MIRROR = "http://deb.debian.org/debian";

/**
 * The Debian mirror to build from: the configured one (PYRO_DEBIAN_MIRROR, read by
 * src/core/config.ts), else the one apt on this host uses for the main archive, else the
 * project default.
 */
export async function resolveMirror(configured?: string, aptDir = "/etc/apt"): Promise<string> {
  if (configured) return configured.replace(/\/+$/, "");
  const found = await hostAptMirror(aptDir);
  return found ?? FALLBACK_MIRROR;
}

/** Reads deb822 `.sources` files and the one-line `sources.list`; skips security suites. */
export async function hostAptMirror(aptDir: string): Promise<string | null> {
  const texts: string[] = [];
  try {
    texts.push(await readFile(join(aptDir, "sources.list"), "utf8"));
  } catch {
    // absent on deb822-only hosts
  }
  try {
    for (const f of (await readdir(join(aptDir, "sources.list.d"))).sort()) {
      if (f.endsWith(".sources") || f.endsWith(".list"))
        texts.push(await readFile(join(aptDir, "sources.list.d", f), "utf8"));
    }
  } catch {
    // no directory
  }
  for (const text of texts) {
    const m = parseMirror(text);
    if (m) return m;
  }
  return null;
}

export function parseMirror(text: string): string | null {
  // one-line format: deb [opts] URI SUITE COMPONENTS
  for (const raw of text.split("\n")) {
    const line = raw.trim();
    if (!line.startsWith("deb ")) continue;
    const parts = line
      .replace(/\[[^\]]*\]/, "")
      .split(/\s+/)
      .filter(Boolean);
    const [, uri, suite] = parts;
    if (uri && suite && isMainDebianSuite(suite) && /^https?:\/\//.test(uri)) return uri.replace(/\/+$/, "");
  }
  // deb822 stanzas
  for (const stanza of text.split(/\n\s*\n/)) {
    const fields = new Map<string, string>();
    for (const raw of stanza.split("\n")) {
      if (raw.trim().startsWith("#")) continue;
      const m = /^([A-Za-z-]+):\s*(.*)$/.exec(raw);
      if (m?.[1] && m[2] !== undefined) fields.set(m[1].toLowerCase(), m[2].trim());
    }
    const types = fields.get("types") ?? "";
    const suites = (fields.get("suites") ?? "").split(/\s+/);
    const uri = (fields.get("uris") ?? "").split(/\s+/)[0];
    if (fields.get("enabled") === "no") continue;
    if (
      types.split(/\s+/).includes("deb") &&
      uri &&
      /^https?:\/\//.test(uri) &&
      suites.some(isMainDebianSuite)
    ) {
      return uri.replace(/\/+$/, "");
    }
  }
  return null;
}

function isMainDebianSuite(suite: string): boolean {
  return /^(bookworm|trixie|bullseye|stable|testing|sid|unstable)$/.test(suite);
}
