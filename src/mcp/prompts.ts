/**
 * Prompts as data: one per mode and per use case (CONTRACT §8, §10), each a recipe that
 * walks a model through one workflow with the tools of the server's tool set. A prompt
 * lists the tools it cannot do without (`needs`); a server whose set lacks one does not
 * offer the prompt. Optional steps name their tool and are left out when the set lacks it,
 * so a rendered prompt never mentions a tool the model cannot call.
 */
import type { ToolName } from "./profiles.js";
import { coldStart } from "./prompts/cold-start.js";
import { inspect } from "./prompts/inspect.js";
import { parallelWorkspaces, reproFix } from "./prompts/repro-fix.js";
import { reviewEval } from "./prompts/review-eval.js";

/** What completion/complete offers for an argument (host/completions.ts). */
export type CompletionKind = "workspace" | "environment" | "snapshot" | "service";

export interface PromptArgument {
  name: string;
  description: string;
  required: boolean;
  complete?: CompletionKind;
}

/** One step of a recipe: shown when the server has every tool it names. */
export interface Step {
  text: (a: Args) => string;
  /** The tools the step tells the model to call; the step is left out without them. */
  tools: readonly ToolName[];
  /** Shown only when this argument was given (or, with `!`, when it was not). */
  when?: string;
  /** Left out when the server has this tool (a better step does the same job). */
  unless?: ToolName;
}

export type Args = Record<string, string | undefined>;

export interface PromptDefinition {
  name: string;
  title: string;
  description: string;
  /** Which mode and use case (CONTRACT §8) it follows. */
  follows: { mode: string; use_case: string };
  arguments: readonly PromptArgument[];
  /** Tools the recipe cannot do without. */
  needs: readonly ToolName[];
  /** A first line framing the task. */
  intro: (a: Args) => string;
  steps: readonly Step[];
  /** Closing advice. */
  outro?: string;
}

/** Every prompt, in the order prompts/list shows them (definitions under prompts/, by mode). */
export const PROMPTS: readonly PromptDefinition[] = [
  reproFix,
  inspect,
  coldStart,
  reviewEval,
  parallelWorkspaces,
];

/** The prompts a tool set can run: every tool a prompt needs is in the set. */
export function promptsFor(available: ReadonlySet<ToolName>): PromptDefinition[] {
  return PROMPTS.filter((p) => p.needs.every((t) => available.has(t)));
}

/** The recipe text for one prompt, naming only tools in `available`. */
export function renderPrompt(p: PromptDefinition, args: Args, available: ReadonlySet<ToolName>): string {
  const steps = p.steps.filter((s) => {
    if (!s.tools.every((t) => available.has(t))) return false;
    if (s.unless !== undefined && available.has(s.unless)) return false;
    if (s.when === undefined) return true;
    return s.when.startsWith("!") ? !args[s.when.slice(1)] : Boolean(args[s.when]);
  });
  const lines = [p.intro(args), "", "Steps:", ...steps.map((s, i) => `${i + 1}. ${s.text(args)}`)];
  if (p.outro) lines.push("", p.outro);
  lines.push("", "Tool failures come back as isError with {error: {code, message, hint}}: follow the hint.");
  return lines.join("\n");
}
