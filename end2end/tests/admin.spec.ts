import { test, expect } from '@playwright/test';
import { agentToken, mcpSession, shot, signIn, toolNames } from './support';

test('ada proposes a tool-list change, cannot approve it herself, bob approves and tools/list changes', async ({ page, browser, baseURL }) => {
  const token = agentToken('worker.comms');
  const session = await mcpSession(baseURL!, token);
  const before = await toolNames(baseURL!, token, session, 2);
  expect(before).not.toContain('invoice.search');
  expect(before).toContain('note.discard');

  // Ada, an admin, ticks invoice.search and unticks note.discard for worker.comms.
  await signIn(page, /Sign in as Ada/, '/admin');
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
  await signIn(bob, /Sign in as Bob/, '/admin');
  const pending = bob.locator('[data-testid="proposal"][data-status="proposed"]');
  await pending.getByTestId('decision-reason').fill('Agreed with the comms lead');
  await pending.getByTestId('approve').click();
  await expect(bob).toHaveURL(/\/admin\?done=approved$/);
  await expect(bob.getByTestId('notice')).toContainText('Approved');
  await expect(bob.locator('[data-testid="proposal"][data-status="approved"]')).toHaveCount(1);
  await expect(bob.getByRole('checkbox', { name: 'worker.comms may use invoice.search' })).toBeChecked();
  await bob.screenshot({ path: shot('admin'), fullPage: true });

  // The running server's tools/list for that role changed, in the same MCP session.
  const after = await toolNames(baseURL!, token, session, 4);
  expect(after).toContain('invoice.search');
  expect(after).not.toContain('note.discard');
  await bobContext.close();
});
