/**
 * Secret values shorter than this are not redacted: a two-letter "secret" would turn
 * ordinary output into a sea of markers while protecting nothing.
 */
export const MIN_SECRET_LENGTH = 4;

/**
 * Replaces every occurrence of each secret value in `text` with `[REDACTED:NAME]`.
 *
 * `secrets` maps secret names to their values (held in memory only; see `SecretRef`).
 * All values are matched in a single pass, longest first, so a secret that contains
 * another is replaced whole, and a marker already written is never matched again. When
 * two names share a value, the first one in iteration order names the marker.
 *
 * It works on whole strings: redact a command's full output before cutting it into
 * tails or chunks, or a secret split across a cut could slip through in pieces.
 */
export function redact(text: string, secrets: SecretValues): string {
  return redactor(secrets)(text);
}

/** Secret names mapped to values: a `Map` or a plain object. */
export type SecretValues = ReadonlyMap<string, string> | Readonly<Record<string, string>>;

/**
 * `redact` with the secrets bound: builds the pattern once, for callers that redact
 * many chunks (logs, summaries). Later changes to `secrets` are not seen.
 */
export function redactor(secrets: SecretValues): (text: string) => string {
  const names = new Map<string, string>();
  const pairs = secrets instanceof Map ? [...secrets.entries()] : Object.entries(secrets);
  for (const [name, value] of pairs) {
    if (value.length >= MIN_SECRET_LENGTH && !names.has(value)) names.set(value, name);
  }
  if (names.size === 0) return (text) => text;
  // Alternation tries branches left to right, so longest-first makes the longest
  // secret win where several start at the same position.
  const values = [...names.keys()].sort((a, b) => b.length - a.length);
  const pattern = new RegExp(values.map(escapeRegExp).join("|"), "g");
  return (text) => text.replace(pattern, (match) => `[REDACTED:${names.get(match)}]`);
}

function escapeRegExp(s: string): string {
  return s.replace(/[.*+?^${}()|[\]\\]/g, "\\$&");
}
