import { test, expect } from '@playwright/test';
import { agentToken, decide, gatedPayment, mcp, mcpSession, payment, shot, signIn } from './support';

test('runs, the run timeline, the audit search and the gate metrics show what agents and people did', async ({ page, baseURL }) => {
  const token = agentToken();
  const session = await mcpSession(baseURL!, token, 'e2e-views');
  const pay = (amount: number) => payment('INV-20260612', amount);
  const approved = await gatedPayment(baseURL!, token, session, 2, pay(1860.5));
  const rejected = await gatedPayment(baseURL!, token, session, 3, pay(1860.0));

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
  await page.screenshot({ path: shot('runs'), fullPage: true });

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
  await page.screenshot({ path: shot('run-timeline'), fullPage: true });

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
  await page.screenshot({ path: shot('audit'), fullPage: true });
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
  await page.screenshot({ path: shot('gates'), fullPage: true });
});
