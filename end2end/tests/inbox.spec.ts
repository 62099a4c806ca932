import { test, expect } from '@playwright/test';
import { addPasskey, agentToken, decide, gatedPayment, mcp, mcpSession, payment, shot, signIn } from './support';

test('ana opens the inbox, sees the gated payment and approves it with a reason', async ({ page, baseURL }) => {
  const token = agentToken();
  const session = await mcpSession(baseURL!, token);
  const args = payment('INV-20260611', 4180.0);
  const step = await gatedPayment(baseURL!, token, session, 2, args);

  await signIn(page, /Sign in as Ana/);
  // payment.schedule requires a signature: her approval is signed with a passkey.
  await addPasskey(page);
  await page.getByRole('navigation', { name: 'Main' }).getByRole('link', { name: 'Inbox' }).click();
  await expect(page.getByRole('heading', { level: 1, name: 'Approval inbox' })).toBeVisible();
  const row = page.locator(`[data-testid="gate-row"][data-step-id="${step}"]`);
  await expect(row).toContainText('payment.schedule');
  await expect(row).toContainText('4,180.00 EUR');
  await expect(row).toContainText('invoice INV-20260611');
  await expect(row).toContainText(/expires in \d+ h/);
  await page.screenshot({ path: shot('inbox-list'), fullPage: true });

  await row.getByRole('link', { name: /Review/ }).click();
  await expect(page).toHaveURL(new RegExp(`/inbox/${step}$`));
  await expect(page.getByTestId('gate-inputs')).toContainText('"amount": 4180');
  await expect(page.getByTestId('gate-reason')).toHaveText(args.reason);
  await page.getByLabel(/Reason/).fill('Three-way match checked against PO 4471');
  await page.screenshot({ path: shot('inbox-detail'), fullPage: true });
  await page.getByTestId('approve').click();

  await expect(page).toHaveURL(/\/inbox\?done=approved$/);
  await expect(page.getByTestId('notice')).toContainText('Approved');
  await expect(page.locator(`[data-step-id="${step}"]`)).toHaveCount(0);
  await page.screenshot({ path: shot('inbox-approved'), fullPage: true });

  // The agent's next call runs the approved step.
  const again = await mcp(baseURL!, token, session, 3, 'tools/call', { name: 'payment.schedule', arguments: args });
  expect(again.reply.result.structuredContent.status).toBe('scheduled');
});

test('a gate opened while the inbox is open appears without reload and keeps the j/k position', async ({ page, baseURL }) => {
  const token = agentToken();
  const session = await mcpSession(baseURL!, token, 'e2e-live');
  const pay = (amount: number) =>
    payment('INV-20260615', amount, 'Warehouse racking instalment agreed with the supplier', '2026-06-30');
  const firstStep = await gatedPayment(baseURL!, token, session, 2, pay(900.0));

  await signIn(page, /Sign in as Ana/);
  await page.goto('/inbox');
  // Hydrated: the list now polls the server.
  await expect(page.getByTestId('gate-count')).toHaveAttribute('data-live', 'on');
  const firstLink = page.locator(`[data-testid="gate-row"][data-step-id="${firstStep}"] a`);
  await firstLink.focus();
  await expect(firstLink).toBeFocused();
  // A marker that a reload would wipe.
  await page.evaluate(() => { (window as unknown as { inboxMarker: string }).inboxMarker = 'same page'; });

  const secondStep = await gatedPayment(baseURL!, token, session, 3, pay(950.0));

  const secondRow = page.locator(`[data-testid="gate-row"][data-step-id="${secondStep}"]`);
  await expect(secondRow).toContainText('950.00 EUR', { timeout: 15_000 });
  expect(await page.evaluate(() => (window as unknown as { inboxMarker?: string }).inboxMarker)).toBe('same page');
  // The new row did not take the focus, and j moves on from where the person was.
  await expect(firstLink).toBeFocused();
  await expect(page.getByTestId('gate-count')).toContainText('waiting');
  await page.screenshot({ path: shot('inbox-live'), fullPage: true });
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

test('the creator of an agent credential cannot countersign its payment; the gate page says why', async ({ page, baseURL }) => {
  // Ana created this agent's credential: she is accountable for what it proposes.
  const token = agentToken('worker.finance', 'person:urn:countersign:demo#ana');
  const session = await mcpSession(baseURL!, token, 'e2e-creator');
  const args = payment('INV-20260615', 640.0, 'Warehouse racking deposit agreed with the supplier', '2026-06-30');
  const step = await gatedPayment(baseURL!, token, session, 2, args);

  await signIn(page, /Sign in as Ana/);
  await addPasskey(page);
  await page.goto(`/inbox/${step}`);
  await page.getByLabel(/Reason/).fill('Three-way match checked against PO 4471');
  await page.getByTestId('approve').click();
  await expect(page).toHaveURL(new RegExp(`/inbox/${step}\\?error=creator$`));
  await expect(page.getByText(/another approver must countersign it/)).toBeVisible();
  await page.screenshot({ path: shot('inbox-creator-refused'), fullPage: true });

  // Nothing was approved: the agent's next call still waits for a person.
  const again = await mcp(baseURL!, token, session, 3, 'tools/call', { name: 'payment.schedule', arguments: args });
  expect(again.reply.result.structuredContent.status).toBe('needs_approval');

  // Stopping is always safe: her rejection goes through.
  await decide(page, step, 'reject');
  await expect(page).toHaveURL(/\/inbox\?done=rejected$/);
});

test('ana ticks three gates of one tool, sees their total, approves them at once; the one she may not countersign is refused and keeps waiting', async ({ page, baseURL }) => {
  const token = agentToken();
  const session = await mcpSession(baseURL!, token, 'e2e-batch');
  // Ana created this credential: its payment needs another approver (a duty, checked per step).
  const own = agentToken('worker.finance', 'person:urn:countersign:demo#ana');
  const ownSession = await mcpSession(baseURL!, own, 'e2e-batch-own');
  const reason = 'Freight June instalment agreed with the supplier';
  const a = await gatedPayment(baseURL!, token, session, 2, payment('INV-20260612', 1200.0, reason, '2026-06-30'));
  const b = await gatedPayment(baseURL!, token, session, 3, payment('INV-20260612', 1300.0, reason, '2026-06-30'));
  const c = await gatedPayment(baseURL!, own, ownSession, 2, payment('INV-20260612', 1400.0, reason, '2026-06-30'));

  await signIn(page, /Sign in as Ana/, '/inbox');
  // One passkey signature over the three payments' ordered (step, inputs hash) pairs.
  await addPasskey(page);
  await page.goto('/inbox');
  await expect(page.getByTestId('gate-count')).toHaveAttribute('data-live', 'on');
  for (const step of [a, b, c]) {
    await page.locator(`[data-testid="gate-row"][data-step-id="${step}"]`).getByTestId('gate-select').check();
  }
  await expect(page.getByTestId('batch-summary')).toHaveText('3 selected (payment.schedule) · total 3,900.00 EUR');
  await page.getByTestId('batch-reason').fill('Freight instalments checked against PO-77813');
  await page.screenshot({ path: shot('inbox-batch'), fullPage: true });
  await page.getByTestId('batch-approve').click();

  await expect(page.getByRole('heading', { name: 'Batch decision' })).toBeVisible();
  await expect(page.getByRole('status')).toHaveText('2 of 3 gate(s) approved; 1 not decided, still waiting.');
  await expect(page.getByTestId('batch-done')).toHaveCount(2);
  await expect(page.getByTestId('batch-refused')).toContainText('1,400.00 EUR');
  await page.screenshot({ path: shot('inbox-batch-result'), fullPage: true });

  // The approved ones left the inbox (they run on the agent's next call; not run here: the
  // invoice is paid by a later spec); the refused one still waits.
  await page.goto('/inbox');
  await expect(page.locator(`[data-testid="gate-row"][data-step-id="${a}"]`)).toHaveCount(0);
  await expect(page.locator(`[data-testid="gate-row"][data-step-id="${b}"]`)).toHaveCount(0);
  const waits = await mcp(baseURL!, own, ownSession, 3, 'tools/call', { name: 'payment.schedule', arguments: payment('INV-20260612', 1400.0, reason, '2026-06-30') });
  expect(waits.reply.result.structuredContent.status).toBe('needs_approval');

  // Stopping is always safe: she rejects it in a batch of one.
  await expect(page.getByTestId('gate-count')).toHaveAttribute('data-live', 'on');
  await page.locator(`[data-testid="gate-row"][data-step-id="${c}"]`).getByTestId('gate-select').check();
  await page.getByTestId('batch-reason').fill('Ana created this agent: not hers to countersign');
  await page.getByTestId('batch-reject').click();
  await expect(page.getByRole('status')).toHaveText('1 of 1 gate(s) rejected; 0 not decided, still waiting.');
});
