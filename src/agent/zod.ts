/**
 * The agent protocol's schemas (op-schemas.ts, messages.ts) use zod's "mini" build,
 * `import * as z from "zod/mini"`, of which a bundle takes only the parts it uses. The
 * classic build is one object graph of ~95 modules built at import: it was most of the
 * guest agent's start-up cost after Node itself (measured here: ~80 ms of CPU against
 * ~15 ms for mini), paid on every create, start and reset. Mini ships no error messages;
 * importing this module configures the English ones, so both sides report the same
 * issues as with the classic build.
 */
import { config } from "zod/mini";
import en from "zod/v4/locales/en.js";

config(en());
