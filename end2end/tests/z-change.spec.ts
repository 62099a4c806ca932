// Change with confidence (issue 33): the gate advisor recommends on recorded decisions and a
// manager drafts its proposal; an admin proposes raising the invoice-hold threshold, sees the
// impact preview's counts and an example on the admin page, and a second admin approves it.
// Named to run last (files run in name order): it changes the registry in force and puts
// invoice INV-20260615 on hold, which the other specs' payments must not meet.
import { test, expect, Page } from '@playwright/test';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { e2eBinary, e2eEnv } from '../playwright.config';
import { agentToken, mcp, mcpSession, shot, signIn } from './support';

/** The CLI on the server's database. */
function cli(args: string[]): string {
  return execFileSync(e2eBinary, args, { env: { ...process.env, ...e2eEnv }, encoding: 'utf8' });
}

/** Decides gate `step` through the decision API in `page`'s signed-in session. */
async function decideApi(page: Page, baseURL: string, step: string, verdict: 'approved' | 'rejected') {
  const resp = await page.request.post(`/api/steps/${step}/decision`, {
    headers: { origin: baseURL },
    data: { verdict, reason: 'Goods receipt shows the shortfall' },
  });
  expect(resp.status(), await resp.text()).toBe(200);
}

test('the advisor drafts a proposal for a manager; an admin previews a raised hold threshold and a second admin approves it', async ({ page, browser, baseURL }) => {
  test.setTimeout(120_000);
  const token = agentToken();
  const session = await mcpSession(baseURL!, token, 'e2e-change');
  const steps: string[] = [];
  for (let i = 0; i < 20; i++) {
    const call = await mcp(baseURL!, token, session, 10 + i, 'tools/call', {
      name: 'invoice.hold',
      arguments: { invoice_id: 'INV-20260615', amount: 1100 + i, currency: 'EUR', reason: `Racking delivery ${i}: quantity disputed` },
    });
    expect(call.reply.result.structuredContent.status).toBe('needs_approval');
    steps.push(call.reply.result.structuredContent.step_id);
  }
  await signIn(page, /Sign in as Ana/);
  for (const step of steps) await decideApi(page, baseURL!, step, 'approved');

  // Max, a manager, reads the advisor and drafts its proposal.
  const maxContext = await browser.newContext({ baseURL });
  const max = await maxContext.newPage();
  await signIn(max, /Sign in as Max/, '/gates');
  const advice = max.locator('[data-testid="advice"][data-tool="invoice.hold"][data-rule="amount.threshold"]');
  await expect(advice).toHaveAttribute('data-advice', 'consider_reviewer');
  await expect(advice.getByTestId('advice-words')).toHaveText('consider moving this step to the model reviewer');
  await max.screenshot({ path: shot('advisor'), fullPage: true });
  await advice.getByTestId('draft').click();
  await expect(max).toHaveURL(/\/gates\?done=drafted$/);
  await expect(max.getByTestId('notice')).toContainText('Proposal drafted');
  await maxContext.close();

  // Ada proposes the raised threshold from the command line (policy text is proposed as a
  // bundle), on the version in force.
  const dir = mkdtempSync(join(tmpdir(), 'countersign-e2e-bundle-'));
  cli(['registry', 'export', '--out', dir]);
  const policy = join(dir, 'policy.cedar');
  writeFileSync(policy, readFileSync(policy, 'utf8').replace('context.args.amount_minor > 100000', 'context.args.amount_minor > 300000'));
  const preview = JSON.parse(cli(['registry', 'preview', dir, '--tenant', 'acme', '--json']));
  expect(preview.transitions['require_approval->allow']).toBe(20);
  cli(['registry', 'import', dir, '--by', 'urn:countersign:demo#ada', '--note', 'Raise the invoice-hold threshold to 3,000 EUR']);

  // On the admin page, Ada sees the preview's counts and an example; she cannot approve it.
  const adaContext = await browser.newContext({ baseURL });
  const ada = await adaContext.newPage();
  await signIn(ada, /Sign in as Ada/, '/admin');
  const raised = ada.locator('[data-testid="proposal"][data-status="proposed"]', { hasText: 'Raise the invoice-hold threshold' });
  await expect(raised.getByTestId('preview-summary')).toContainText('20 would be decided differently');
  await expect(raised.locator('[data-testid="preview-transition"][data-transition="require_approval->allow"]')).toContainText('20');
  await raised.getByText('Example calls').click();
  await expect(raised.getByTestId('preview-example').first()).toContainText('invoice.hold');
  await expect(raised.getByTestId('own-proposal')).toBeVisible();
  await ada.screenshot({ path: shot('proposal-preview'), fullPage: true });
  await adaContext.close();

  // Bob, the platform admin, approves it; a 2,000 EUR hold now runs unattended.
  const bobContext = await browser.newContext({ baseURL });
  const bob = await bobContext.newPage();
  await signIn(bob, /Sign in as Bob/, '/admin');
  const pending = bob.locator('[data-testid="proposal"][data-status="proposed"]', { hasText: 'Raise the invoice-hold threshold' });
  await expect(pending.getByTestId('preview')).toBeVisible();
  await pending.getByTestId('decision-reason').fill('The preview shows only holds between 1,000 and 3,000 EUR change');
  await pending.getByTestId('approve').click();
  await expect(bob).toHaveURL(/\/admin\?done=approved$/);
  await bobContext.close();
  const after = await mcp(baseURL!, token, session, 99, 'tools/call', {
    name: 'invoice.hold',
    arguments: { invoice_id: 'INV-20260615', amount: 2000, currency: 'EUR', reason: 'Racking delivery 99: quantity disputed' },
  });
  expect(after.reply.result.structuredContent.status).toBe('on_hold');
});
