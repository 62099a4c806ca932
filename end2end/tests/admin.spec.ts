import { test, expect } from '@playwright/test';
import { execFileSync } from 'node:child_process';
import { mkdirSync } from 'node:fs';
import { join } from 'node:path';
import { e2eBinary, e2eEnv } from '../playwright.config';

const shots = join(__dirname, '..', 'test-results', 'screenshots');

// An agent credential for `role`, created with the CLI on the server's database.
function agentToken(role: string): string {
  const out = execFileSync(
    e2eBinary,
    ['agent-token', 'create', '--name', `e2e-${role}-${Date.now()}`, '--role', role, '--tenant', 'acme', '--by', 'e2e'],
    { env: { ...process.env, ...e2eEnv }, encoding: 'utf8' },
  );
  return out.trim().split('\n').pop() ?? '';
}

// One JSON-RPC request to /mcp; reads a JSON body or an SSE stream until the response comes.
async function mcp(baseURL: string, token: string, session: string | undefined, id: number | null, method: string, params: object) {
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
  const resp = await fetch(`${baseURL}/mcp`, { method: 'POST', headers, body: JSON.stringify(body) });
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

async function toolNames(baseURL: string, token: string, session: string | undefined, id: number): Promise<string[]> {
  const list = await mcp(baseURL, token, session, id, 'tools/list', {});
  return list.reply.result.tools.map((t: { name: string }) => t.name);
}

test('ada proposes a tool-list change, cannot approve it herself, bob approves and tools/list changes', async ({ page, browser, baseURL }) => {
  const token = agentToken('worker.comms');
  const init = await mcp(baseURL!, token, undefined, 1, 'initialize', {
    protocolVersion: '2025-06-18', capabilities: {}, clientInfo: { name: 'e2e', version: '0' },
  });
  const session = init.session;
  await mcp(baseURL!, token, session, null, 'notifications/initialized', {});
  const before = await toolNames(baseURL!, token, session, 2);
  expect(before).not.toContain('invoice.search');
  expect(before).toContain('note.discard');

  // Ada, an admin, ticks invoice.search and unticks note.discard for worker.comms.
  await page.goto('/auth/demo?next=/admin');
  await page.getByRole('button', { name: /Sign in as Ada/ }).click();
  await expect(page).toHaveURL(/\/admin$/);
  await expect(page.getByRole('heading', { level: 1, name: 'Admin' })).toBeVisible();
  const row = page.locator('[data-testid="tool-row"][data-tool="payment.schedule"]');
  await expect(row.getByTestId('effect')).toHaveText('irreversible');
  await page.getByRole('checkbox', { name: 'worker.comms may use invoice.search' }).check();
  await page.getByRole('checkbox', { name: 'worker.comms may use note.discard' }).uncheck();
  await page.getByTestId('proposal-note').fill('Comms drafts notes after finding the invoice; they never discard them');
  await page.getByTestId('propose').click();
  await expect(page).toHaveURL(/\/admin\?done=proposed$/);
  const proposal = page.locator('[data-testid="proposal"][data-status="proposed"]');
  await expect(proposal.getByTestId('proposal-diff')).toContainText('+ invoice.search for worker.comms');
  await expect(proposal.getByTestId('proposal-diff')).toContainText('- note.discard no longer for worker.comms');
  // Her own proposal offers her no approve button; proposed is not in force.
  await expect(proposal.getByTestId('own-proposal')).toBeVisible();
  await expect(proposal.getByTestId('approve')).toHaveCount(0);
  expect(await toolNames(baseURL!, token, session, 3)).toEqual(before);

  // Bob, a second admin, approves it in his own browser session.
  const bobContext = await browser.newContext({ baseURL });
  const bob = await bobContext.newPage();
  await bob.goto('/auth/demo?next=/admin');
  await bob.getByRole('button', { name: /Sign in as Bob/ }).click();
  await expect(bob).toHaveURL(/\/admin$/);
  const pending = bob.locator('[data-testid="proposal"][data-status="proposed"]');
  await pending.getByTestId('decision-reason').fill('Agreed with the comms lead');
  await pending.getByTestId('approve').click();
  await expect(bob).toHaveURL(/\/admin\?done=approved$/);
  await expect(bob.getByTestId('notice')).toContainText('Approved');
  await expect(bob.locator('[data-testid="proposal"][data-status="approved"]')).toHaveCount(1);
  await expect(bob.getByRole('checkbox', { name: 'worker.comms may use invoice.search' })).toBeChecked();
  mkdirSync(shots, { recursive: true });
  await bob.screenshot({ path: join(shots, 'admin.png'), fullPage: true });

  // The running server's tools/list for that role changed, in the same MCP session.
  const after = await toolNames(baseURL!, token, session, 4);
  expect(after).toContain('invoice.search');
  expect(after).not.toContain('note.discard');
  await bobContext.close();
});
