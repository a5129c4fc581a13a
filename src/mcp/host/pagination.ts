/** Pagination of tools/list, resources/list and prompts/list: opaque `cursor`/`nextCursor`. */
import { ErrorCode, McpError } from "@modelcontextprotocol/sdk/types.js";

/** Default page size of paginated lists; a host may see fewer per page, never more. */
export const PAGE_SIZE = 100;

/** One page of `all` from an opaque cursor (the offset, base64url JSON). */
export function page<T>(all: readonly T[], cursor: string | undefined, size: number) {
  let offset = 0;
  if (cursor !== undefined) {
    try {
      const v = JSON.parse(Buffer.from(cursor, "base64url").toString("utf8")) as { o?: unknown };
      if (typeof v.o !== "number" || !Number.isInteger(v.o) || v.o < 0) throw new Error("bad offset");
      offset = v.o;
    } catch {
      throw new McpError(ErrorCode.InvalidParams, "invalid cursor: pass back a nextCursor this server gave");
    }
  }
  const items = all.slice(offset, offset + size);
  const next = offset + size < all.length ? encodeCursor(offset + size) : undefined;
  return { items, nextCursor: next };
}

export function encodeCursor(offset: number): string {
  return Buffer.from(JSON.stringify({ o: offset })).toString("base64url");
}
