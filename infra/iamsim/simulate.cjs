// Answers IAM questions with @cloud-copilot/iam-simulate: reads a JSON
// array of questions on stdin and writes one answer per question, in order,
// to stdout. iamsim.Ask runs it; REAPER_IAM_SIMULATE is the package's
// directory (hack/setup.sh installs it).
"use strict";
const path = require("path");
const { createRequire } = require("module");

const dir = process.env.REAPER_IAM_SIMULATE;
if (!dir) {
  throw new Error('REAPER_IAM_SIMULATE is not set: run eval "$(hack/setup.sh)"');
}
const { runSimulation } = createRequire(path.join(dir, "package.json"))("@cloud-copilot/iam-simulate");

// FullAWSAccess: an organization's SCPs allow nothing without an Allow of
// their own, which AWS attaches to every root, OU and account by default.
const fullAccess = { name: "FullAWSAccess", policy: { Version: "2012-10-17", Statement: [{ Effect: "Allow", Action: "*", Resource: "*" }] } };

// sids lists the Sid (or index) of every statement under key in an
// analysis, wherever it sits (identity, SCP levels).
function sids(analysis, key) {
  const out = [];
  const walk = (v) => {
    if (Array.isArray(v)) return v.forEach(walk);
    if (!v || typeof v !== "object") return;
    for (const [k, w] of Object.entries(v)) {
      if (k === key && Array.isArray(w)) {
        for (const s of w) out.push(`${s.policyId ?? "?"}:${s.statement?.Sid ?? s.explain?.identifier ?? "?"}`);
      } else {
        walk(w);
      }
    }
  };
  walk(analysis);
  return out;
}

// describe writes a Discovery answer's conditions as one canonical line:
// "always", "never", a leaf "<key> <op> [values]", or a group's members,
// sorted, joined by "and" or "or" in parentheses.
function describe(c) {
  switch (c?.conditionType) {
    case "always":
      return "always";
    case "never":
      return "never";
    case "condition":
      return `${c.inverted ? "not " : ""}${c.key} ${c.op} ${JSON.stringify([...c.values].sort())}`;
    case "sessionName":
      return `session name ${JSON.stringify(c.sessionName)}`;
    case "group": {
      const parts = c.conditions.map(describe).sort();
      return parts.length === 1 ? parts[0] : `(${parts.join(` ${c.operator} `)})`;
    }
  }
  return `unknown ${JSON.stringify(c)}`;
}

async function answer(q) {
  const simulation = {
    request: {
      principal: q.principal,
      action: q.action,
      resource: { resource: q.resource, accountId: q.account },
      contextVariables: q.context ?? {},
    },
    identityPolicies: q.identity ?? [],
    serviceControlPolicies: q.scps?.length ? [{ orgIdentifier: "r-root", policies: [fullAccess, ...q.scps] }] : [],
    resourceControlPolicies: [],
  };
  const options = {};
  if (q.discover) {
    // Discovery: the keys the question gives are known, and so is the
    // absence of those it says are absent; every other one (an instance's
    // tags) may take any value, and the answer says under which conditions
    // on them the request is allowed.
    options.simulationMode = "Discovery";
    options.discoveryContextKeyConstraints = [...Object.keys(simulation.request.contextVariables), ...(q.absent ?? [])].map((keyName) => ({
      keyName,
      presenceIsKnown: true,
      valueIsKnown: true,
    }));
  }
  const r = await runSimulation(simulation, options);
  if (r.resultType === "error") {
    return { error: JSON.stringify(r.errors) };
  }
  if (r.resultType !== "single") {
    return { error: `a ${r.resultType} result: ask about one resource, not a pattern` };
  }
  const analysis = r.result.analysis ?? {};
  const out = { decision: r.overallResult, allowedBy: sids(analysis, "allowStatements"), deniedBy: sids(analysis, "denyStatements") };
  if (q.discover) {
    out.conditions = describe(analysis.conditions ?? { conditionType: r.overallResult === "Allowed" ? "always" : "never" });
  }
  return out;
}

(async () => {
  const chunks = [];
  for await (const c of process.stdin) chunks.push(c);
  const questions = JSON.parse(Buffer.concat(chunks).toString("utf8"));
  const answers = [];
  for (const q of questions) {
    try {
      answers.push(await answer(q));
    } catch (e) {
      answers.push({ error: String(e && e.stack ? e.stack : e) });
    }
  }
  process.stdout.write(JSON.stringify(answers));
})().catch((e) => {
  console.error(e);
  process.exit(1);
});
