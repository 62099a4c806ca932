import { test, expect } from '@playwright/test';
import { execFileSync } from 'node:child_process';
import { mkdirSync } from 'node:fs';
import { join } from 'node:path';
import { e2eBinary, e2eEnv } from '../playwright.config';

const shots = join(__dirname, '..', 'test-results', 'screenshots');

// An agent credential for the finance worker role, created with the CLI on the server's database.
function agentToken(): string {
  const out = execFileSync(
    e2eBinary,
    ['agent-token', 'create', '--name', `e2e-fin-${Date.now()}`, '--role', 'worker.finance', '--tenant', 'acme', '--by', 'e2e'],
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

test('ana opens the inbox, sees the gated payment and approves it with a reason', async ({ page, baseURL }) => {
  const token = agentToken();
  const init = await mcp(baseURL!, token, undefined, 1, 'initialize', {
    protocolVersion: '2025-06-18', capabilities: {}, clientInfo: { name: 'e2e', version: '0' },
  });
  const session = init.session;
  await mcp(baseURL!, token, session, null, 'notifications/initialized', {});
  const args = {
    invoice_id: 'INV-20260611', amount: 4180.0, currency: 'EUR', value_date: '2026-06-15',
    reason: 'Invoice approved by AP, due in four days',
  };
  const call = await mcp(baseURL!, token, session, 2, 'tools/call', { name: 'payment.schedule', arguments: args });
  expect(call.reply.result.structuredContent.status).toBe('needs_approval');
  const step: string = call.reply.result.structuredContent.step_id;

  await page.goto('/auth/demo');
  await page.getByRole('button', { name: /Sign in as Ana/ }).click();
  await page.getByRole('navigation', { name: 'Main' }).getByRole('link', { name: 'Inbox' }).click();
  await expect(page.getByRole('heading', { level: 1, name: 'Approval inbox' })).toBeVisible();
  const row = page.locator(`[data-testid="gate-row"][data-step-id="${step}"]`);
  await expect(row).toContainText('payment.schedule');
  await expect(row).toContainText('4,180.00 EUR');
  await expect(row).toContainText('invoice INV-20260611');
  await expect(row).toContainText(/expires in \d+ h/);
  mkdirSync(shots, { recursive: true });
  await page.screenshot({ path: join(shots, 'inbox-list.png'), fullPage: true });

  await row.getByRole('link', { name: /Review/ }).click();
  await expect(page).toHaveURL(new RegExp(`/inbox/${step}$`));
  await expect(page.getByTestId('gate-inputs')).toContainText('"amount": 4180');
  await expect(page.getByTestId('gate-reason')).toHaveText(args.reason);
  await page.getByLabel(/Reason/).fill('Three-way match checked against PO 4471');
  await page.screenshot({ path: join(shots, 'inbox-detail.png'), fullPage: true });
  await page.getByTestId('approve').click();

  await expect(page).toHaveURL(/\/inbox\?done=approved$/);
  await expect(page.getByTestId('notice')).toContainText('Approved');
  await expect(page.locator(`[data-step-id="${step}"]`)).toHaveCount(0);
  await page.screenshot({ path: join(shots, 'inbox-approved.png'), fullPage: true });

  // The agent's next call runs the approved step.
  const again = await mcp(baseURL!, token, session, 3, 'tools/call', { name: 'payment.schedule', arguments: args });
  expect(again.reply.result.structuredContent.status).toBe('scheduled');
});

test('a gate opened while the inbox is open appears without reload and keeps the j/k position', async ({ page, baseURL }) => {
  const token = agentToken();
  const init = await mcp(baseURL!, token, undefined, 1, 'initialize', {
    protocolVersion: '2025-06-18', capabilities: {}, clientInfo: { name: 'e2e-live', version: '0' },
  });
  const session = init.session;
  await mcp(baseURL!, token, session, null, 'notifications/initialized', {});
  const pay = (amount: number) => ({
    invoice_id: 'INV-20260615', amount, currency: 'EUR', value_date: '2026-06-30',
    reason: 'Warehouse racking instalment agreed with the supplier',
  });
  const first = await mcp(baseURL!, token, session, 2, 'tools/call', { name: 'payment.schedule', arguments: pay(900.0) });
  expect(first.reply.result.structuredContent.status).toBe('needs_approval');
  const firstStep: string = first.reply.result.structuredContent.step_id;

  await page.goto('/auth/demo');
  await page.getByRole('button', { name: /Sign in as Ana/ }).click();
  await page.goto('/inbox');
  // Hydrated: the list now polls the server.
  await expect(page.getByTestId('gate-count')).toHaveAttribute('data-live', 'on');
  const firstLink = page.locator(`[data-testid="gate-row"][data-step-id="${firstStep}"] a`);
  await firstLink.focus();
  await expect(firstLink).toBeFocused();
  // A marker that a reload would wipe.
  await page.evaluate(() => { (window as unknown as { inboxMarker: string }).inboxMarker = 'same page'; });

  const second = await mcp(baseURL!, token, session, 3, 'tools/call', { name: 'payment.schedule', arguments: pay(950.0) });
  expect(second.reply.result.structuredContent.status).toBe('needs_approval');
  const secondStep: string = second.reply.result.structuredContent.step_id;

  const secondRow = page.locator(`[data-testid="gate-row"][data-step-id="${secondStep}"]`);
  await expect(secondRow).toContainText('950.00 EUR', { timeout: 15_000 });
  expect(await page.evaluate(() => (window as unknown as { inboxMarker?: string }).inboxMarker)).toBe('same page');
  // The new row did not take the focus, and j moves on from where the person was.
  await expect(firstLink).toBeFocused();
  await expect(page.getByTestId('gate-count')).toContainText('waiting');
  mkdirSync(shots, { recursive: true });
  await page.screenshot({ path: join(shots, 'inbox-live.png'), fullPage: true });
  await page.keyboard.press('j');
  await expect(secondRow.locator('a')).toBeFocused();
  await page.keyboard.press('k');
  await expect(firstLink).toBeFocused();

  // Decided elsewhere (the JSON API, same person): the rows leave the open page too, and the
  // inbox is empty again for the specs after this one.
  for (const step of [firstStep, secondStep]) {
    const resp = await page.request.post(`/api/steps/${step}/decision`, {
      headers: { origin: baseURL! },
      data: { verdict: 'rejected', reason: 'e2e: closing the live-inbox gates' },
    });
    expect(resp.ok()).toBe(true);
  }
  await expect(page.locator('[data-testid="gate-row"]')).toHaveCount(0, { timeout: 15_000 });
  await expect(page.getByText('No gated calls are waiting for approval.')).toBeVisible();
  expect(await page.evaluate(() => (window as unknown as { inboxMarker?: string }).inboxMarker)).toBe('same page');
});
