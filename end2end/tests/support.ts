// What the specs share: agent credentials made with the CLI, MCP calls over HTTP, the demo
// sign-in, gate decisions in the inbox, and where screenshots go.
import { expect, Page } from '@playwright/test';
import { execFileSync } from 'node:child_process';
import { mkdirSync } from 'node:fs';
import { join } from 'node:path';
import { e2eBinary, e2eEnv } from '../playwright.config';

const axePath = require.resolve('axe-core/axe.min.js');

/** The serious and critical axe-core violations on the page as it is now, one line each. */
export async function axeViolations(page: Page): Promise<string[]> {
  await page.addScriptTag({ path: axePath });
  const results = await page.evaluate(async () => {
    const axe = (window as unknown as { axe: { run: (ctx: Document, opts: object) => Promise<{ violations: Array<{ id: string; impact: string; help: string; nodes: Array<{ target: string[] }> }> }> } }).axe;
    return axe.run(document, { resultTypes: ['violations'] });
  });
  return results.violations
    .filter((v) => v.impact === 'serious' || v.impact === 'critical')
    .map((v) => `${v.impact} ${v.id}: ${v.help} — ${v.nodes.map((n) => n.target.join(' ')).slice(0, 5).join(', ')}`);
}

/** Where every spec saves its page screenshots (kept with the run's other artifacts). */
export const shotsDir = join(__dirname, '..', 'test-results', 'screenshots');

/** The path of screenshot `name` (`name.png`), creating the folder on first use. */
export function shot(name: string): string {
  mkdirSync(shotsDir, { recursive: true });
  return join(shotsDir, `${name}.png`);
}

/** An agent credential for `role` in tenant acme, created with the CLI on the server's database
 * by `by` (recorded as its creator, who may never approve its steps). */
export function agentToken(role = 'worker.finance', by = 'e2e'): string {
  const out = execFileSync(
    e2eBinary,
    ['agent-token', 'create', '--name', `e2e-${role}-${Date.now()}`, '--role', role, '--tenant', 'acme', '--by', by],
    { env: { ...process.env, ...e2eEnv }, encoding: 'utf8' },
  );
  return out.trim().split('\n').pop() ?? '';
}

/** One JSON-RPC request to /mcp (`id` null: a notification); reads a JSON body or an SSE
 * stream until the response comes. */
export async function mcp(baseURL: string, token: string, session: string | undefined, id: number | null, method: string, params: object) {
  const headers: Record<string, string> = {
    authorization: `Bearer ${token}`,
    accept: 'application/json, text/event-stream',
    'content-type': 'application/json',
  };
  if (session) {
    headers['mcp-session-id'] = session;
    headers['mcp-protocol-version'] = '2025-06-18';
  }
  const body = id === null ? { jsonrpc: '2.0', method, params } : { jsonrpc: '2.0', id, method, params };
  // Node may resolve localhost to ::1 first, and the server listens on 127.0.0.1: an agent's
  // bearer-token call needs no browser origin.
  const url = `${baseURL.replace('//localhost:', '//127.0.0.1:')}/mcp`;
  const resp = await fetch(url, { method: 'POST', headers, body: JSON.stringify(body) });
  const newSession = resp.headers.get('mcp-session-id') ?? session;
  if (id === null) {
    expect(resp.status).toBe(202);
    return { session: newSession, reply: null };
  }
  expect(resp.status).toBe(200);
  if (!(resp.headers.get('content-type') ?? '').startsWith('text/event-stream')) {
    return { session: newSession, reply: await resp.json() };
  }
  const reader = resp.body!.getReader();
  const decoder = new TextDecoder();
  let buf = '';
  for (;;) {
    const { value, done } = await reader.read();
    if (done) throw new Error(`stream ended before response ${id}: ${buf}`);
    buf += decoder.decode(value, { stream: true });
    for (const line of buf.split('\n')) {
      if (!line.startsWith('data:')) continue;
      try {
        const msg = JSON.parse(line.slice(5).trim());
        if (msg.id === id) {
          await reader.cancel();
          return { session: newSession, reply: msg };
        }
      } catch { /* partial line */ }
    }
  }
}

/** An initialised MCP session for `token` (initialize, then notifications/initialized). */
export async function mcpSession(baseURL: string, token: string, client = 'e2e'): Promise<string | undefined> {
  const init = await mcp(baseURL, token, undefined, 1, 'initialize', {
    protocolVersion: '2025-06-18', capabilities: {}, clientInfo: { name: client, version: '0' },
  });
  await mcp(baseURL, token, init.session, null, 'notifications/initialized', {});
  return init.session;
}

/** The tool names `tools/list` offers in `session`. */
export async function toolNames(baseURL: string, token: string, session: string | undefined, id: number): Promise<string[]> {
  const list = await mcp(baseURL, token, session, id, 'tools/list', {});
  return list.reply.result.tools.map((t: { name: string }) => t.name);
}

/** `payment.schedule` arguments for invoice `invoice`. */
export function payment(invoice: string, amount: number, reason = 'Invoice approved by AP, due in four days', valueDate = '2026-06-15') {
  return { invoice_id: invoice, amount, currency: 'EUR', value_date: valueDate, reason };
}

/** Calls `payment.schedule`; expects it parked at a gate and returns its step id. */
export async function gatedPayment(baseURL: string, token: string, session: string | undefined, id: number, args: object): Promise<string> {
  const call = await mcp(baseURL, token, session, id, 'tools/call', { name: 'payment.schedule', arguments: args });
  expect(call.reply.result.structuredContent.status).toBe('needs_approval');
  return call.reply.result.structuredContent.step_id;
}

/** Signs in through the demo page as the person whose button matches `who`, landing on
 * `next` (default the home page). */
export async function signIn(page: Page, who: RegExp, next?: string) {
  await page.goto(next ? `/auth/demo?next=${encodeURIComponent(next)}` : '/auth/demo');
  await page.getByRole('button', { name: who }).click();
  await expect(page).toHaveURL(next ? new RegExp(`${next.replace(/[/?]/g, '\\$&')}$`) : /\/$/);
}

/** Pages that hold a virtual authenticator with a registered passkey. */
const withPasskey = new WeakSet<Page>();

/** Gives `page` a CDP virtual authenticator (CTAP2, internal, user verification on, presence
 * answered automatically: WebAuthn without a device) and registers a passkey for the signed-in
 * person on the Passkeys page. Once per page. */
export async function addPasskey(page: Page, label = 'e2e authenticator') {
  if (withPasskey.has(page)) return;
  const cdp = await page.context().newCDPSession(page);
  await cdp.send('WebAuthn.enable', { enableUI: false });
  await cdp.send('WebAuthn.addVirtualAuthenticator', {
    options: {
      protocol: 'ctap2',
      transport: 'internal',
      hasResidentKey: true,
      hasUserVerification: true,
      isUserVerified: true,
      automaticPresenceSimulation: true,
    },
  });
  await page.goto('/passkeys');
  await page.getByLabel(/Name this passkey/).fill(label);
  await page.getByTestId('passkey-add').click();
  await expect(page).toHaveURL(/\/passkeys\?done=registered$/);
  withPasskey.add(page);
}

/** Approves or rejects gate `step` in the inbox, with a reason (an approval of a tool that
 * requires a signature is signed with a passkey, added first when the page has none). */
export async function decide(page: Page, step: string, verdict: 'approve' | 'reject') {
  if (verdict === 'approve') await addPasskey(page);
  await page.goto(`/inbox/${step}`);
  await page.getByLabel(/Reason/).fill(verdict === 'approve' ? 'Three-way match checked against PO 4471' : 'Amount does not match the purchase order');
  await page.getByTestId(verdict).click();
  await expect(page).toHaveURL(/\/inbox\?done=/);
}
