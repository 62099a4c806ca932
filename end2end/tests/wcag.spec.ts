// Accessibility of every page: axe-core (from node_modules, injected into the page; no
// network) finds no serious or critical violation, the keyboard focus is always visible and
// starts at the skip link, and at 200 % zoom of a 1280 px window (a 640 px wide viewport at
// twice the pixel density) the page reflows without horizontal scrolling. Each page is saved
// as a screenshot at 100 % and at 200 %.
//
// Runs last (the specs run in file order on one server): it leaves a gate waiting and a
// proposal open, which the other specs do not expect.
import { test, expect, Browser, Page } from '@playwright/test';
import { agentToken, axeViolations, decide, gatedPayment, mcp, mcpSession, payment, shot, signIn } from './support';

type Who = RegExp | null;
type Target = { name: string; who: Who; path: string };

const ana = /Sign in as Ana/;
const aud = /Sign in as Aud/;
const max = /Sign in as Max/;
const bob = /Sign in as Bob/;
const ada = /Sign in as Ada/;

// Filled by the set-up test: the pages that need data get an address with data.
const targets: Target[] = [
  { name: 'demo-sign-in', who: null, path: '/auth/demo' },
  { name: 'signed-out', who: null, path: '/auth/signed-out' },
  { name: 'home', who: ana, path: '/' },
  { name: 'inbox', who: ana, path: '/inbox' },
  { name: 'escalations', who: ana, path: '/escalations' },
  { name: 'passkeys', who: ana, path: '/passkeys' },
];

test.describe.configure({ mode: 'serial' });

/** A page in a fresh context, signed in as `who` (or signed out). The context ignores the
 * pages' Content-Security-Policy: axe-core is injected as a script the policy would refuse
 * (the smoke spec checks the policy itself). */
async function open(browser: Browser, baseURL: string, who: Who, options = {}) {
  const context = await browser.newContext({ baseURL, bypassCSP: true, ...options });
  const page = await context.newPage();
  if (who) await signIn(page, who);
  return { context, page };
}

/** Tabs through the page: the skip link comes first, and every element that takes the focus
 * shows it (an outline or a ring). Returns the elements whose focus is invisible. */
async function invisibleFocus(page: Page, stops = 40): Promise<string[]> {
  await page.evaluate(() => (document.activeElement as HTMLElement | null)?.blur());
  const invisible: string[] = [];
  const seen = new Set<string>();
  for (let i = 0; i < stops; i++) {
    await page.keyboard.press('Tab');
    const focused = await page.evaluate(() => {
      const el = document.activeElement as HTMLElement | null;
      if (!el || el === document.body) return null;
      const style = getComputedStyle(el);
      const outline = style.outlineStyle !== 'none' && parseFloat(style.outlineWidth) > 0;
      const ring = style.boxShadow !== 'none' && style.boxShadow !== '';
      const label = `${el.tagName.toLowerCase()}${el.id ? `#${el.id}` : ''} "${(el.getAttribute('aria-label') ?? el.textContent ?? '').trim().slice(0, 40)}"`;
      const key = `${label}@${Math.round(el.getBoundingClientRect().top)}`;
      return { label, key, visible: outline || ring, skip: el.getAttribute('href') === '#main' };
    });
    if (!focused) break;
    if (i === 0 && (await page.locator('a[href="#main"]').count()) > 0) {
      expect(focused.skip, 'the skip link is the first tab stop').toBe(true);
    }
    if (seen.has(focused.key)) break;
    seen.add(focused.key);
    if (!focused.visible) invisible.push(focused.label);
  }
  return invisible;
}

/** How far the page is wider than its viewport (0 = no horizontal scrolling). */
async function horizontalOverflow(page: Page): Promise<number> {
  return page.evaluate(() => document.documentElement.scrollWidth - document.documentElement.clientWidth);
}

test('set-up: a waiting gate, a finished run and an open proposal to look at', async ({ page, browser, baseURL }) => {
  test.setTimeout(60_000);
  const token = agentToken();
  const session = await mcpSession(baseURL!, token, 'e2e-wcag');
  const paid = await gatedPayment(baseURL!, token, session, 2, payment('INV-20260613', 1860.5));
  const waiting = await gatedPayment(baseURL!, token, session, 3, payment('INV-20260613', 12750.0));
  await signIn(page, ana);
  await decide(page, paid, 'approve');
  const ran = await mcp(baseURL!, token, session, 4, 'tools/call', { name: 'payment.schedule', arguments: payment('INV-20260613', 1860.5) });
  expect(ran.reply.result.structuredContent.status).toBe('scheduled');
  targets.push({ name: 'inbox-detail', who: ana, path: `/inbox/${waiting}` });

  await page.goto('/runs');
  const run = await page.getByTestId('run-row').first().getAttribute('data-run-id');
  targets.push({ name: 'runs', who: aud, path: '/runs' });
  targets.push({ name: 'run-timeline', who: aud, path: `/runs/${run}` });
  targets.push({ name: 'audit', who: aud, path: '/audit' });
  targets.push({ name: 'audit-filtered', who: aud, path: `/audit?run=${run}` });
  targets.push({ name: 'metrics', who: max, path: '/gates' });

  // Ada proposes a change; Bob's admin page then offers approve and reject for it.
  const { context, page: admin } = await open(browser, baseURL!, ada);
  await admin.goto('/admin');
  await admin.getByRole('checkbox', { name: 'worker.comms may use po.get' }).check();
  await admin.getByTestId('proposal-note').fill('Comms looks invoices up before drafting a note');
  await admin.getByTestId('propose').click();
  await expect(admin).toHaveURL(/\/admin\?done=proposed$/);
  await context.close();
  targets.push({ name: 'admin', who: bob, path: '/admin' });
});

test('the admin buttons name the proposal they decide', async ({ browser, baseURL }) => {
  const { context, page } = await open(browser, baseURL!, bob);
  await page.goto('/admin');
  const proposal = page.locator('[data-testid="proposal"][data-status="proposed"]').first();
  const id = (await proposal.getAttribute('data-proposal-id'))!.slice(0, 8);
  await expect(proposal.getByRole('heading', { name: `Proposal ${id}` })).toBeVisible();
  await expect(proposal.getByRole('button', { name: `Approve proposal ${id}`, exact: true })).toBeVisible();
  await expect(proposal.getByRole('button', { name: `Reject proposal ${id}`, exact: true })).toBeVisible();
  await expect(proposal.getByRole('textbox', { name: `Reason for proposal ${id}`, exact: true })).toBeVisible();
  await context.close();
});

test('every page passes axe-core and shows the keyboard focus', async ({ browser, baseURL }) => {
  test.setTimeout(180_000);
  const failures: string[] = [];
  for (const t of targets) {
    const { context, page } = await open(browser, baseURL!, t.who);
    const resp = await page.goto(t.path);
    expect(resp?.status(), t.path).toBeLessThan(400);
    await page.screenshot({ path: shot(`a11y-${t.name}`), fullPage: true });
    for (const v of await axeViolations(page)) failures.push(`${t.path}: ${v}`);
    for (const el of await invisibleFocus(page)) failures.push(`${t.path}: no visible focus on ${el}`);
    await context.close();
  }
  expect(failures).toEqual([]);
});

test('every page reflows at 200 % zoom without horizontal scrolling', async ({ browser, baseURL }) => {
  test.setTimeout(120_000);
  const failures: string[] = [];
  for (const t of targets) {
    // A 1280 × 800 window at 200 %: 640 × 400 CSS pixels, each drawn with 2 × 2 device pixels.
    const { context, page } = await open(browser, baseURL!, t.who, { viewport: { width: 640, height: 400 }, deviceScaleFactor: 2 });
    await page.goto(t.path);
    const over = await horizontalOverflow(page);
    if (over > 0) failures.push(`${t.path}: ${over} px wider than the window`);
    await page.screenshot({ path: shot(`zoom200-${t.name}`), fullPage: true });
    await context.close();
  }
  expect(failures).toEqual([]);
});
