// Playwright drives Debian's Chromium (/usr/bin/chromium); it never downloads a browser.
// The server under test is the real `countersign serve` binary built by `cargo leptos build`,
// on its own port with a fresh SQLite database.
import { defineConfig } from '@playwright/test';
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';

const root = resolve(__dirname, '..');
const port = Number(process.env.E2E_PORT ?? 3107);
// The config is evaluated again in each worker: keep the runner's data directory.
const dataDir = process.env.E2E_DATA_DIR ?? (process.env.E2E_DATA_DIR = mkdtempSync(join(tmpdir(), 'countersign-e2e-')));
// cargo builds into CARGO_TARGET_DIR when it is set (the site stays in target/site).
const binary = process.env.E2E_BINARY ?? join(process.env.CARGO_TARGET_DIR ?? join(root, 'target'), 'debug', 'countersign');

/** The server binary and the settings it runs with (tests run the CLI on the same database). */
export const e2eBinary = binary;
export const e2eEnv: Record<string, string> = {
  COUNTERSIGN_LISTEN: `127.0.0.1:${port}`,
  COUNTERSIGN_DATABASE_URL: `sqlite://${join(dataDir, 'e2e.db')}`,
  COUNTERSIGN_SITE_ROOT: join(root, 'target', 'site'),
  COUNTERSIGN_LOG_LEVEL: 'warn',
  COUNTERSIGN_DEMO_SIGN_IN: 'true',
  COUNTERSIGN_REGISTRY: join(root, 'examples', 'finance'),
  // An unknown outcome the ERP cannot tell about goes to the escalations page at the
  // reconciler's next pass (a-escalations.spec.ts).
  COUNTERSIGN_ESCALATE_UNKNOWN_AFTER_SECONDS: '0',
};

export default defineConfig({
  testDir: './tests',
  outputDir: './test-results',
  fullyParallel: false,
  workers: 1,
  retries: 0,
  reporter: [['list']],
  timeout: 30_000,
  use: {
    // localhost, not 127.0.0.1: WebAuthn refuses IP addresses. Behind its loopback public URL
    // the server takes http://localhost:PORT as its own origin (passkeys.spec.ts).
    baseURL: `http://localhost:${port}`,
    screenshot: 'only-on-failure',
    trace: 'off',
    launchOptions: {
      executablePath: process.env.CHROMIUM ?? '/usr/bin/chromium',
      args: [
        '--no-sandbox',
        '--disable-gpu',
        '--disable-quic',
        '--no-first-run',
        '--disable-background-networking',
        '--disable-component-update',
        '--disable-sync',
      ],
    },
  },
  webServer: {
    command: `${binary} serve`,
    cwd: root,
    url: `http://127.0.0.1:${port}/healthz`,
    reuseExistingServer: false,
    timeout: 60_000,
    stdout: 'pipe',
    stderr: 'pipe',
    env: e2eEnv,
  },
});
