import { test, expect, Page } from '@playwright/test';
import { execFileSync } from 'node:child_process';
import { mkdirSync } from 'node:fs';
import { join } from 'node:path';
import { e2eBinary, e2eEnv } from '../playwright.config';

const shots = join(__dirname, '..', 'test-results', 'screenshots');

function agentToken(): string {
  const out = execFileSync(
    e2eBinary,
    ['agent-token', 'create', '--name', `e2e-views-${Date.now()}`, '--role', 'worker.finance', '--tenant', 'acme', '--by', 'e2e'],
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

async function signIn(page: Page, who: RegExp) {
  await page.goto('/auth/demo');
  await page.getByRole('button', { name: who }).click();
  await expect(page).toHaveURL(/\/$/);
}

async function decide(page: Page, step: string, verdict: 'approve' | 'reject') {
  await page.goto(`/inbox/${step}`);
  await page.getByLabel(/Reason/).fill(verdict === 'approve' ? 'Three-way match checked against PO 4471' : 'Amount does not match the purchase order');
  await page.getByTestId(verdict).click();
  await expect(page).toHaveURL(/\/inbox\?done=/);
}

test('runs, the run timeline, the audit search and the gate metrics show what agents and people did', async ({ page, baseURL }) => {
  mkdirSync(shots, { recursive: true });
  const token = agentToken();
  const init = await mcp(baseURL!, token, undefined, 1, 'initialize', {
    protocolVersion: '2025-06-18', capabilities: {}, clientInfo: { name: 'e2e-views', version: '0' },
  });
  const session = init.session;
  await mcp(baseURL!, token, session, null, 'notifications/initialized', {});
  const pay = (amount: number) => ({
    invoice_id: 'INV-20260612', amount, currency: 'EUR', value_date: '2026-06-15',
    reason: 'Invoice approved by AP, due in four days',
  });
  const first = await mcp(baseURL!, token, session, 2, 'tools/call', { name: 'payment.schedule', arguments: pay(1860.5) });
  expect(first.reply.result.structuredContent.status).toBe('needs_approval');
  const approved: string = first.reply.result.structuredContent.step_id;
  const second = await mcp(baseURL!, token, session, 3, 'tools/call', { name: 'payment.schedule', arguments: pay(1860.0) });
  expect(second.reply.result.structuredContent.status).toBe('needs_approval');
  const rejected: string = second.reply.result.structuredContent.step_id;

  // Ana approves one and rejects the other; the agent's next call runs the approved one.
  await signIn(page, /Sign in as Ana/);
  await decide(page, approved, 'approve');
  await decide(page, rejected, 'reject');
  const again = await mcp(baseURL!, token, session, 4, 'tools/call', { name: 'payment.schedule', arguments: pay(1860.5) });
  expect(again.reply.result.structuredContent.status).toBe('scheduled');

  // Runs: newest first; this run is on top, with its step counts.
  await page.getByRole('navigation', { name: 'Main' }).getByRole('link', { name: 'Runs' }).click();
  await expect(page.getByRole('heading', { level: 1, name: 'Runs' })).toBeVisible();
  const top = page.getByTestId('run-row').first();
  await expect(top.getByTestId('run-steps')).toContainText('2 step(s): 1 done');
  await expect(top).toContainText('active');
  await page.screenshot({ path: join(shots, 'runs.png'), fullPage: true });

  // The timeline: both steps, statuses in words, amounts with currency, linked records.
  await top.getByRole('link').first().click();
  await expect(page.getByTestId('run-timeline')).toBeVisible();
  const done = page.locator(`[data-testid="step-row"][data-step-id="${approved}"]`);
  await expect(done).toContainText('1,860.50 EUR');
  await expect(done).toContainText('done');
  await expect(done.getByTestId('step-links')).toContainText(/proposal #\d+.*decision #\d+.*approved #\d+.*succeeded #\d+/);
  const refused = page.locator(`[data-testid="step-row"][data-step-id="${rejected}"]`);
  await expect(refused).toContainText('1,860.00 EUR');
  await expect(refused).toContainText('refused');
  await expect(refused.getByTestId('step-links')).toContainText(/rejected #\d+/);
  // Following a link lands on the audit record's anchor.
  await done.getByRole('link', { name: /approved #/ }).click();
  await expect(page).toHaveURL(/#rec-\d+$/);
  const anchor = new URL(page.url()).hash.slice(1);
  await expect(page.locator(`#${anchor}`)).toHaveAttribute('data-event', 'approved');
  await page.screenshot({ path: join(shots, 'run-timeline.png'), fullPage: true });

  // Audit: the auditor filters by approver and event, expands a record, sees the chain is OK.
  await signIn(page, /Sign in as Aud/);
  await page.goto('/audit');
  await expect(page.getByTestId('chain-status')).toHaveAttribute('data-chain', 'ok');
  await page.getByLabel('Approver').fill('ana');
  await page.getByLabel('Status / event').selectOption('rejected');
  await page.getByRole('button', { name: 'Search' }).click();
  await expect(page).toHaveURL(/approver=ana/);
  const rows = page.getByTestId('audit-row');
  await expect(rows.first()).toHaveAttribute('data-event', 'rejected');
  await expect(rows.first()).toContainText('reason: Amount does not match the purchase order');
  await rows.first().locator('summary').click();
  await expect(rows.first().locator('pre')).toContainText('"event": "rejected"');
  await page.screenshot({ path: join(shots, 'audit.png'), fullPage: true });
  // The export link carries the filter; it answers JSON lines of stored records.
  const href = await page.getByTestId('export').getAttribute('href');
  expect(href).toContain('/audit/export.jsonl?');
  expect(href).toContain('approver=ana');
  const exported = await page.request.get(href!);
  expect(exported.status()).toBe(200);
  const lines = (await exported.text()).trim().split('\n').map((l) => JSON.parse(l));
  expect(lines.length).toBeGreaterThan(0);
  expect(lines.every((r) => r.event === 'rejected' && typeof r.hash === 'string' && typeof r.prev === 'string')).toBe(true);

  // Metrics: the manager sees payment.schedule's rejection rate and its break-even.
  await signIn(page, /Sign in as Max/);
  await page.getByRole('navigation', { name: 'Main' }).getByRole('link', { name: 'Metrics' }).click();
  await expect(page.getByRole('heading', { level: 1, name: 'Gate metrics' })).toBeVisible();
  const row = page.locator('[data-testid="break-even-row"][data-tool="payment.schedule"]');
  await expect(row.getByTestId('rate')).toHaveText(/%/);
  await expect(row.getByTestId('break-even')).toHaveText(/approvals/);
  await expect(page.locator('[data-testid="rate-chart"][data-label="payment.schedule"] svg')).toBeVisible();
  await expect(page.getByTestId('latency')).toContainText('p50');
  await page.screenshot({ path: join(shots, 'gates.png'), fullPage: true });
});
