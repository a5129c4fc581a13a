import type { CamelCased } from "./schemas.js";

/** `maxOutputBytes` → `max_output_bytes`: the core's spelling of an SDK option key. */
export function snakeKey(key: string): string {
  return key.replace(/[A-Z]/g, (c) => `_${c.toLowerCase()}`);
}

/**
 * The core's options from the SDK's: camelCase keys back to the core's snake_case, unset
 * options left out. The one place the SDK renames option keys; `checkArgs` has already
 * refused any key the method does not take, so every key maps to a core option.
 */
export function coreOptions<T>(options: CamelCased<T> | undefined): T {
  const out: Record<string, unknown> = {};
  for (const [key, value] of Object.entries(options ?? {}))
    if (value !== undefined) out[snakeKey(key)] = value;
  return out as T;
}
