// The slack a host gives an agent request beyond the bound it names, apart from the
// client so that code which only computes a timeout does not load the protocol schemas.

/**
 * Slack given to exec beyond its own timeout_ms: killing the tree and replying take time
 * (a VM under emulation is slow at both). The one slack of an exec: callers pass no
 * timeout of their own.
 */
export const EXEC_SLACK_MS = 30_000;
/**
 * Slack given to a request that waits inside the agent for a bound it names (a shell
 * read's idle wait, a service's readiness), beyond that bound: the agent's last try and
 * its reply. Callers pass `timeoutMs: wait + WAIT_SLACK_MS`.
 */
export const WAIT_SLACK_MS = 15_000;
