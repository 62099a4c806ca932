import { test, expect } from '@playwright/test';
import { shot, signIn } from './support';

// The e2e server has no OIDC issuer and listens on loopback: sign in through the demo page.
test.beforeEach(async ({ page }) => {
  await signIn(page, /Sign in as Ana/);
});

test('the dashboard shell renders, is styled, and hydrates', async ({ page }) => {
  const errors: string[] = [];
  page.on('pageerror', (e) => errors.push(String(e)));
  page.on('console', (m) => { if (m.type() === 'error') errors.push(m.text()); });
  page.on('response', (r) => { if (r.status() >= 400) errors.push(`${r.status()} ${r.url()}`); });

  await page.goto('/');
  await expect(page.getByRole('link', { name: 'Countersign' })).toBeVisible();
  await expect(page.getByTestId('demo-banner')).toHaveText('Demo sign-in: not for production');
  for (const label of ['Inbox', 'Runs', 'Audit', 'Metrics', 'Admin']) {
    await expect(page.getByRole('navigation', { name: 'Main' }).getByRole('link', { name: label })).toBeVisible();
  }

  // Tailwind's stylesheet is served and applied: the primary button is indigo, not the UA default.
  const button = page.getByTestId('hydration-button');
  const bg = await button.evaluate((el) => getComputedStyle(el).backgroundColor);
  expect(bg).not.toBe('rgba(0, 0, 0, 0)');
  expect(bg).not.toBe('rgb(239, 239, 239)');

  // Hydration: only the wasm bundle attaches the click handler and flips the status.
  await expect(page.getByTestId('hydration-status')).toHaveText('Interactive', { timeout: 15_000 });
  await button.click();
  await button.click();
  await expect(page.getByTestId('hydration-clicks')).toHaveText('Clicks: 2');

  await page.screenshot({ path: shot('home'), fullPage: true });
  expect(errors).toEqual([]);
});

test('a script injected into a page does not run; the page still hydrates under its policy', async ({ page }) => {
  const resp = await page.goto('/');
  const policy = resp?.headers()['content-security-policy'] ?? '';
  const nonce = /'nonce-([^']+)'/.exec(policy)?.[1];
  expect(nonce, policy).toBeTruthy();
  expect(policy).toContain("frame-ancestors 'none'");
  // The page's own scripts carry the nonce: hydration works under the policy.
  await expect(page.getByTestId('hydration-status')).toHaveText('Interactive', { timeout: 15_000 });
  // Markup that slipped past escaping (an inline handler, an inline script) is refused by the browser.
  const ran = await page.evaluate(async () => {
    const w = window as unknown as { injected?: number };
    const box = document.createElement('div');
    box.innerHTML = '<img src="/no-such-image.png" onerror="window.injected = 1">';
    document.body.appendChild(box);
    await new Promise((r) => setTimeout(r, 500));
    return w.injected ?? 0;
  });
  expect(ran).toBe(0);
  // A second page load gets a fresh nonce.
  const again = await page.goto('/');
  const second = /'nonce-([^']+)'/.exec(again?.headers()['content-security-policy'] ?? '')?.[1];
  expect(second).toBeTruthy();
  expect(second).not.toBe(nonce);
});

test('every page is reachable from the navigation and says when it is empty', async ({ page }) => {
  const pages: Array<[string, string, RegExp]> = [
    ['Inbox', 'Approval inbox', /No gated calls/],
    ['Runs', 'Runs', /No runs yet|step\(s\)/],
    // Ana is an approver: the audit trail and the metrics are not hers to read.
    ['Audit', 'Audit', /The audit trail is for auditors/],
    ['Metrics', 'Gate metrics', /Gate metrics is for managers/],
    ['Admin', 'Admin', /This page is for admins/],
    ['Passkeys', 'Passkeys', /Your passkeys/],
  ];
  await page.goto('/');
  await expect(page.getByTestId('hydration-status')).toHaveText('Interactive', { timeout: 15_000 });
  for (const [link, heading, empty] of pages) {
    await page.getByRole('navigation', { name: 'Main' }).getByRole('link', { name: link }).click();
    await expect(page.getByRole('heading', { level: 1, name: heading })).toBeVisible();
    await expect(page.getByText(empty).first()).toBeVisible();
    // admin.png is the admin spec's (an admin's view); here Ana is refused.
    const name = link === 'Admin' ? 'admin-refused' : link.toLowerCase();
    await page.screenshot({ path: shot(name), fullPage: true });
  }
});

test('an unknown path is a 404 page, and /healthz reports the database', async ({ page, request }) => {
  const resp = await page.goto('/no-such-page');
  expect(resp?.status()).toBe(404);
  await expect(page.getByRole('heading', { name: 'Not found' })).toBeVisible();

  const health = await request.get('/healthz');
  expect(health.status()).toBe(200);
  // Version 1 is the configured registry; the admin spec may have approved a change since.
  const body = await health.json();
  expect(body).toMatchObject({ status: 'ok', database: 'sqlite' });
  expect(body.registry_version).toBeGreaterThanOrEqual(1);
});
