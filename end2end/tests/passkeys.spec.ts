import { test, expect } from '@playwright/test';
import { execFileSync } from 'node:child_process';
import { e2eBinary, e2eEnv } from '../playwright.config';
import { addPasskey, agentToken, gatedPayment, mcp, mcpSession, payment, shot, signIn } from './support';

// The countersignature is a signature (issue 38): Pat registers a passkey (a CDP virtual
// authenticator with user verification), signs a payment gate, the worker runs it once, the
// audit page marks the approval signed, and `audit verify-signatures` checks it offline.
test('pat signs a payment with a passkey; it runs once and its signature verifies from the audit trail', async ({ page, baseURL }) => {
  const token = agentToken();
  const session = await mcpSession(baseURL!, token, 'e2e-passkey');
  const args = payment('INV-20260617', 2460.0, 'Spindle delivery invoice matched to PO-77817', '2026-07-01');
  const step = await gatedPayment(baseURL!, token, session, 2, args);

  // Without a passkey the gate says so plainly and links to registration.
  // Pat approves no payment in the specs before this one: he holds no passkey yet.
  await signIn(page, /Sign in as Pat/);
  await page.goto(`/inbox/${step}`);
  await expect(page.getByTestId('signature-needs')).toContainText('2,460.00 EUR');
  await expect(page.getByTestId('signed-fields')).toContainText('INV-20260617');
  await expect(page.getByTestId('signature-list')).toContainText('First signature: an approver — needed');
  await expect(page.getByTestId('no-passkey')).toContainText('you have none yet');
  // The API refuses an approval without an assertion, audited.
  const unsigned = await page.request.post(`/api/steps/${step}/decision`, {
    data: { verdict: 'approved', reason: 'Trying without a passkey' },
    headers: { origin: new URL(baseURL!).origin },
  });
  expect(unsigned.status()).toBe(403);
  expect((await unsigned.json()).rule).toBe('signature.missing');

  // She registers one, and the Passkeys page lists it.
  // (The page's accessibility is checked with the others in wcag.spec.ts.)
  await addPasskey(page, 'Pat laptop');
  await expect(page.getByTestId('passkey-row').filter({ hasText: 'Pat laptop' })).toHaveCount(1);
  await page.screenshot({ path: shot('passkeys'), fullPage: true });

  // Approve: the browser's passkey signs the challenge derived from this exact payment.
  await page.goto(`/inbox/${step}`);
  await expect(page.getByTestId('no-passkey')).toHaveCount(0);
  await page.getByLabel(/Reason/).fill('Three-way match checked against PO-77817');
  await page.screenshot({ path: shot('passkey-gate'), fullPage: true });
  await page.getByTestId('approve').click();
  await expect(page).toHaveURL(/\/inbox\?done=approved$/);

  // The agent's next call runs the approved step (once: its idempotency key is derived).
  const ran = await mcp(baseURL!, token, session, 3, 'tools/call', { name: 'payment.schedule', arguments: args });
  expect(ran.reply.result.structuredContent.status).toBe('scheduled');

  // The auditor sees it signed, and the whole-chain check verifies every signature.
  await signIn(page, /Sign in as Aud/, '/audit');
  await page.goto(`/audit?event=approved&tool=payment.schedule`);
  const signed = page.locator('[data-testid="audit-row"]', { has: page.getByTestId('audit-signed') });
  await expect(signed.first()).toBeVisible();
  await page.goto(`/audit?verify=full`);
  await expect(page.getByTestId('signature-status')).toHaveAttribute('data-signatures', 'ok');
  await page.screenshot({ path: shot('audit-signed'), fullPage: true });

  // And anyone with the database (or an export) can check it with the CLI.
  const out = execFileSync(e2eBinary, ['audit', 'verify-signatures'], {
    env: { ...process.env, ...e2eEnv },
    encoding: 'utf8',
  });
  expect(out).toMatch(/signatures intact: [1-9]\d* signed decision\(s\)/);
});
