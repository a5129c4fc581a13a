/** The MIME type a resource read reports for a workspace file, from its extension. */
const MIME: Record<string, string> = {
  md: "text/markdown",
  json: "application/json",
  js: "text/javascript",
  mjs: "text/javascript",
  ts: "text/x-typescript",
  py: "text/x-python",
  sh: "text/x-shellscript",
  html: "text/html",
  css: "text/css",
  csv: "text/csv",
  xml: "application/xml",
  yaml: "application/yaml",
  yml: "application/yaml",
  toml: "application/toml",
  diff: "text/x-diff",
  patch: "text/x-diff",
  png: "image/png",
  jpg: "image/jpeg",
  jpeg: "image/jpeg",
  gif: "image/gif",
  svg: "image/svg+xml",
  pdf: "application/pdf",
  gz: "application/gzip",
  zip: "application/zip",
  tar: "application/x-tar",
};

export function mimeOf(path: string, text: boolean): string {
  const ext = /\.([A-Za-z0-9]+)$/.exec(path)?.[1]?.toLowerCase();
  const m = ext ? MIME[ext] : undefined;
  if (m && (text ? !m.startsWith("image/") || m === "image/svg+xml" : true)) return m;
  return text ? "text/plain" : "application/octet-stream";
}
