// The escalations page (issue 36): an unknown outcome the ERP cannot tell reconciliation about
// is settled by two people with the ERP's reference, and a failed run's note whose undo failed
// is undone once by an admin's approval. The situations are made by a scenario played with the
// CLI on the server's database (faults injected into the demo ERP).
//
// Runs first (the admin spec takes note.discard away from worker.comms, which would leave the
// note's undo to be done by hand). It pays INV-20260616, which no other spec uses, and leaves
// the ERP's lookup down, which no other spec needs.
import { test, expect, Page } from '@playwright/test';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { e2eBinary, e2eEnv } from '../playwright.config';
import { axeViolations, shot, signIn } from './support';

const SCENARIO = `
name: e2e escalations
seed: "000"
actors:
  fin: {role: worker.finance}
  planner: {role: planner}
  ana: {person: ana}
steps:
  - as: fin
    call: payment.schedule
    arguments: {invoice_id: INV-20260616, amount: 310, currency: EUR, value_date: "2026-06-30", reason: "Freight surcharge agreed by phone"}
    reply: {equal: {/status: needs_approval}}
    save: {pay: /step_id}
  - as: ana
    decide: {step: "\${pay}", verdict: approved, reason: "Surcharge confirmed by the carrier"}
  - fault: {operation: lookup, mode: unavailable, times: 1000000}
  - fault: {operation: payments.schedule, mode: timeout_after_effect}
  - as: fin
    call: payment.schedule
    arguments: {invoice_id: INV-20260616, amount: 310, currency: EUR, value_date: "2026-06-30", reason: "Freight surcharge agreed by phone"}
    reply: {equal: {/status: unknown}}
  - fault: {operation: invoices.hold, mode: fail}
  - fault: {operation: notes.discard, mode: unavailable}
  - as: planner
    call: plan.submit
    arguments:
      task: Hold invoice INV-20260611 for the damaged bearings
      steps:
        - tool: note.draft
          arguments: {invoice_id: INV-20260611, text: "Holding: two bearings arrived damaged."}
          reason: Tell AP why the invoice is held
          evidence: [INV-20260611]
        - tool: invoice.hold
          arguments: {invoice_id: INV-20260611, amount: 66, currency: EUR, reason: "Two damaged bearings"}
          reason: Hold the damaged bearings' share
          evidence: [INV-20260611]
    save: {failing: /run_id}
  # Under a second here (the hold fails for good, the undo is escalated); slack for a busy machine.
  - wait: {run: "\${failing}", status: failed, timeout_ms: 60000}
expect: {}
`;

test.describe.configure({ mode: 'serial' });

/** The escalation of `kind` made here (the unknown payment of INV-20260616, the undo of the
 * note on INV-20260611), once the page lists it (the reconciler escalates the unknown at its
 * next pass). */
function card(page: Page, kind: string) {
  const about = kind === 'unknown' ? 'INV-20260616' : 'INV-20260611';
  return page.locator(`[data-testid="escalation"][data-kind="${kind}"]`).filter({ hasText: about });
}

async function escalation(page: Page, kind: string) {
  await expect
    .poll(async () => {
      await page.goto('/escalations');
      return card(page, kind).count();
    }, { timeout: 20_000 })
    .toBe(1);
  return card(page, kind);
}

test('set-up: a payment whose outcome nobody can tell, and a failed run whose undo failed', async ({ baseURL }) => {
  test.setTimeout(90_000);
  const dir = mkdtempSync(join(tmpdir(), 'countersign-e2e-esc-'));
  const file = join(dir, 'escalations.yaml');
  writeFileSync(file, SCENARIO);
  const began = Date.now();
  try {
    // The server listens on 127.0.0.1; the runner resolving localhost may try ::1 first (as
    // Node's fetch in support.ts). Its passkeys' relying party is localhost either way.
    const url = baseURL!.replace('//localhost:', '//127.0.0.1:');
    const out = execFileSync(e2eBinary, ['scenario', 'run', file, '--url', url], {
      env: { ...process.env, ...e2eEnv },
      encoding: 'utf8',
    });
    console.log(`scenario played in ${Date.now() - began} ms\n${out}`);
  } catch (e) {
    // The runner names each failed check on stdout; the error's message carries only stderr.
    const stdout = (e as { stdout?: string }).stdout ?? '';
    throw new Error(`${(e as Error).message}\n${stdout}`);
  }
});

test('two clerks settle the unknown payment with the ERP reference', async ({ browser, baseURL }) => {
  const context = await browser.newContext({ baseURL, bypassCSP: true });
  const page = await context.newPage();
  await signIn(page, /Sign in as Ana/);
  let unknown = await escalation(page, 'unknown');
  await expect(unknown.getByTestId('what')).toContainText('invoice INV-20260616, 310.00 EUR');
  // Names, not ids: the run by its task.
  await expect(unknown).not.toContainText(/[0-9a-f]{8}-[0-9a-f]{4}-/);
  expect(await axeViolations(page)).toEqual([]);
  await page.screenshot({ path: shot('escalations'), fullPage: true });
  await unknown.getByLabel(/reference/).fill('PAY-E2E-310');
  await unknown.getByLabel(/Reason/).fill('The bank statement shows the transfer');
  await unknown.getByTestId('settle-happened').click();
  await expect(page).toHaveURL(/\/escalations\?done=first$/);
  await expect(page.getByTestId('notice')).toContainText('a second person must confirm');
  await context.close();

  // Pat confirms the same reference: settled, and the run shows the step done.
  const second = await browser.newContext({ baseURL });
  const pat = await second.newPage();
  await signIn(pat, /Sign in as Pat/);
  unknown = await escalation(pat, 'unknown');
  await expect(unknown.getByTestId('first')).toContainText('reference PAY-E2E-310');
  await unknown.getByLabel(/reference/).fill('PAY-E2E-310');
  await unknown.getByLabel(/Reason/).fill('Confirmed on the bank statement');
  await unknown.getByTestId('settle-happened').click();
  await expect(pat).toHaveURL(/\/escalations\?done=settled$/);
  await expect(card(pat, 'unknown')).toHaveCount(0);
  await second.close();
});

test('a clerk approves the undo of the failed run\'s note, which runs once', async ({ browser, baseURL }) => {
  const context = await browser.newContext({ baseURL });
  const page = await context.newPage();
  // note.draft has no approval settings: its escalations are the approvers'.
  await signIn(page, /Sign in as Pat/);
  const undo = await escalation(page, 'undo');
  await expect(undo).toContainText('Hold invoice INV-20260611 for the damaged bearings');
  await undo.getByLabel(/Reason/).fill('The note must not stay on the invoice');
  await undo.getByTestId('undo').click();
  await expect(page).toHaveURL(/\/escalations\?done=undone$/);
  await expect(card(page, 'undo')).toHaveCount(0);
  // The run's timeline shows the compensation done, headed by its task.
  await page.getByRole('link', { name: 'Runs' }).click();
  await page.getByRole('link', { name: /Hold invoice INV-20260611 for the damaged bearings/ }).first().click();
  await expect(page.getByTestId('run-task')).toHaveText('Hold invoice INV-20260611 for the damaged bearings');
  await expect(page.getByTestId('step-row').filter({ hasText: 'note.discard' }).filter({ hasText: 'done' })).toHaveCount(1);
  await context.close();
});
