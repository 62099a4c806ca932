// A real OpenID Connect provider (npm `oidc-provider`) for Countersign's sign-in tests.
//
//   node end2end/oidc/provider.mjs
//
// Starts two issuers on ephemeral loopback ports, sharing one freshly generated RSA signing key:
// `main` (the one Countersign is configured with) and `other` (a second, distinct issuer, for the
// wrong-issuer case), and prints one JSON line: {"main": URL, "other": URL}. It then reads one
// JSON line from stdin, {"redirect_uri": "http://127.0.0.1:PORT/auth/callback"} (the server
// under test is started once the issuer URL is known), registers the clients, prints
// {"ready": true, "now": ms} and serves until stdin closes (the test holds the pipe, so the
// provider dies with it). Until then every request is answered 503.
//
// Both know two confidential clients, `countersign` and `other-client` (secret = id + "-secret"),
// PKCE required. Interactions are real provider interactions, answered without a form: the
// test follows the redirect to /interaction/UID and adds `?login=USER`; consent is pre-granted
// for these first-party clients. Users and their `groups` / `tenant` claims are in USERS.
//
// Test hooks (on `main` only): POST /__test__/tamper with {"mode":"alg_none"} or
// {"mode":"replace","id_token":"..."} or {"mode":"drop_auth_time"} or {"mode":"claims",
// "set":{...}} or {"mode":"drop_refresh_token"} changes the NEXT token response — its
// id_token to the same claims unsigned (alg none), to a token the test obtained elsewhere
// (for another client, or from the other issuer), re-signed without `auth_time` or with
// claims changed; or leaves out the refresh token. This is how a misbehaving or compromised
// token endpoint is simulated; everything else is the provider as shipped.
// POST /__test__/user {"user":"ana","set":{"groups":[...]}} changes a user's claims at the
// provider ({"user":"ana","delete":true} removes the account); POST /__test__/backchannel
// {"user":"ana"} sends Countersign a back-channel logout for that user now, as the provider
// does when an administrator signs someone out. On both issuers, POST
// /__test__/logout-token {"user":"ana","sid":...,"nonce":...,"events":false,"client":...}
// returns a logout token the issuer signed (with the given changes) without sending it.

import http from 'node:http';
import { createPrivateKey, generateKeyPairSync, sign } from 'node:crypto';
import Provider from 'oidc-provider';

import readline from 'node:readline';

const USERS = {
  ana: { name: 'Ana Clerk', email: 'ana@acme.test', groups: ['ap-clerks'], tenant: 'acme' },
  max: { name: 'Max Manager', email: 'max@acme.test', groups: ['managers', 'staff'], tenant: 'acme' },
  ada: { name: 'Ada Admin', email: 'ada@acme.test', groups: ['admins'], tenant: 'acme' },
  pia: { name: 'Pia Platform', email: 'pia@acme.test', groups: ['platform-admins'], tenant: 'acme' },
  aud: { name: 'Aud Itor', email: 'aud@acme.test', groups: ['auditors'], tenant: 'acme' },
  eve: { name: 'Eve Nobody', email: 'eve@acme.test', groups: ['staff'], tenant: 'acme' },
};

function signingKey(kid) {
  const { privateKey } = generateKeyPairSync('rsa', { modulusLength: 2048 });
  return { ...privateKey.export({ format: 'jwk' }), kid, use: 'sig', alg: 'RS256' };
}
// Replaced by POST /__test__/rotate (the provider rotates its signing key).
let jwk = signingKey('test-key-1');
let rotations = 1;

const clientsFor = (redirectUri) => ['countersign', 'other-client'].map((id) => ({
  client_id: id,
  client_secret: `${id}-secret`,
  redirect_uris: [redirectUri],
  // Sign-out at the provider comes back here; the provider tells Countersign about a
  // sign-out elsewhere over the back channel.
  post_logout_redirect_uris: [new URL('/auth/signed-out', redirectUri).href],
  backchannel_logout_uri: new URL('/auth/backchannel-logout', redirectUri).href,
  backchannel_logout_session_required: true,
  grant_types: ['authorization_code', 'refresh_token'],
  response_types: ['code'],
  token_endpoint_auth_method: 'client_secret_basic',
}));

function configuration(redirectUri) {
  return {
    clients: clientsFor(redirectUri),
    jwks: { keys: [jwk] },
    pkce: { required: () => true },
    // Short enough that the expired-token test can pass it without outliving the sign-in;
    // an ID token from a refresh lives an hour (the re-check tests move the server's clock
    // minutes ahead of the provider's).
    ttl: {
      IdToken: (ctx) => (ctx?.oidc?.params?.grant_type === 'refresh_token' ? 3600 : 300),
    },
    // Refresh tokens without `offline_access` (as several providers do): bound to the
    // provider's session, so they die with it.
    issueRefreshToken: async (ctx, client) => client.grantTypeAllowed('refresh_token'),
    // The provider refuses to call special-use addresses (SSRF protection); here Countersign
    // runs on loopback, so its back-channel logout calls go out without that dispatcher.
    fetch: (url, { dispatcher: _, ...options }) => globalThis.fetch(url, options),
    conformIdTokenClaims: false,
    claims: { openid: ['sub'], profile: ['name', 'groups', 'tenant'], email: ['email'] },
    features: {
      devInteractions: { enabled: false },
      backchannelLogout: { enabled: true },
      rpInitiatedLogout: { enabled: true },
    },
    interactions: { url: (ctx, interaction) => `/interaction/${interaction.uid}` },
    cookies: { keys: ['countersign-test-cookie-key'] },
    findAccount: async (ctx, id) => {
      const user = USERS[id];
      if (!user) return undefined;
      return { accountId: id, claims: async () => ({ sub: id, ...user }) };
    },
    async loadExistingGrant(ctx) {
      const grant = new ctx.oidc.provider.Grant({
        clientId: ctx.oidc.client.clientId,
        accountId: ctx.oidc.session.accountId,
      });
      grant.addOIDCScope('openid profile email');
      await grant.save();
      return grant;
    },
  };
}

let tamper = null;

function b64url(text) {
  return Buffer.from(text).toString('base64url');
}

async function readBody(req) {
  const chunks = [];
  for await (const chunk of req) chunks.push(chunk);
  return Buffer.concat(chunks).toString('utf8');
}

async function listen() {
  const server = http.createServer((req, res) => res.writeHead(503).end('not ready'));
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  return { server, issuer: `http://127.0.0.1:${server.address().port}` };
}

function serve({ server, issuer }, redirectUri, withHooks) {
  server.removeAllListeners('request');
  const provider = new Provider(issuer, configuration(redirectUri));
  provider.on('server_error', (ctx, err) => console.error('provider error', err));

  if (withHooks) {
    provider.use(async (ctx, next) => {
      await next();
      if (ctx.oidc?.route === 'token' && ctx.status === 200 && tamper && ctx.body?.id_token) {
        const mode = tamper;
        tamper = null;
        if (mode.mode === 'alg_none') {
          const [, payload] = ctx.body.id_token.split('.');
          ctx.body = { ...ctx.body, id_token: `${b64url('{"alg":"none"}')}.${payload}.` };
        } else if (mode.mode === 'replace') {
          ctx.body = { ...ctx.body, id_token: mode.id_token };
        } else if (mode.mode === 'drop_auth_time' || mode.mode === 'claims') {
          // The same token, signed again by the provider's key, without `auth_time` or with
          // claims changed.
          const [header, payload] = ctx.body.id_token.split('.');
          const claims = JSON.parse(Buffer.from(payload, 'base64url').toString('utf8'));
          if (mode.mode === 'drop_auth_time') delete claims.auth_time;
          else Object.assign(claims, mode.set);
          const signed = `${header}.${b64url(JSON.stringify(claims))}`;
          const key = createPrivateKey({ key: jwk, format: 'jwk' });
          const signature = sign('sha256', Buffer.from(signed), key).toString('base64url');
          ctx.body = { ...ctx.body, id_token: `${signed}.${signature}` };
        } else if (mode.mode === 'drop_refresh_token') {
          const { refresh_token: _, ...rest } = ctx.body;
          ctx.body = rest;
        }
      }
    });
  }

  const callback = provider.callback();
  server.on('request', async (req, res) => {
    try {
      const url = new URL(req.url, issuer);
      if (withHooks && url.pathname === '/__test__/rotate' && req.method === 'POST') {
        rotations += 1;
        jwk = signingKey(`test-key-${rotations}`);
        serve({ server, issuer }, redirectUri, withHooks);
        res.writeHead(204).end();
        return;
      }
      if (withHooks && url.pathname === '/__test__/tamper' && req.method === 'POST') {
        tamper = JSON.parse(await readBody(req));
        res.writeHead(204).end();
        return;
      }
      if (withHooks && url.pathname === '/__test__/user' && req.method === 'POST') {
        const change = JSON.parse(await readBody(req));
        if (change.delete) delete USERS[change.user];
        else USERS[change.user] = { ...USERS[change.user], ...change.set };
        res.writeHead(204).end();
        return;
      }
      if (withHooks && url.pathname === '/__test__/backchannel' && req.method === 'POST') {
        const { user } = JSON.parse(await readBody(req));
        const client = await provider.Client.find('countersign');
        await client.backchannelLogout(user, undefined);
        res.writeHead(204).end();
        return;
      }
      if (url.pathname === '/__test__/logout-token' && req.method === 'POST') {
        const ask = JSON.parse(await readBody(req));
        const client = await provider.Client.find(ask.client ?? 'countersign');
        const token = new provider.IdToken({ sub: ask.user }, { client, ctx: undefined });
        token.mask = { sub: null };
        if (ask.events !== false) {
          token.set('events', { 'http://schemas.openid.net/event/backchannel-logout': {} });
        }
        token.set('jti', `jti-${Date.now()}-${Math.random()}`);
        if (ask.sid) token.set('sid', ask.sid);
        if (ask.nonce) token.set('nonce', ask.nonce);
        const logoutToken = await token.issue({ use: 'logout' });
        res.writeHead(200, { 'content-type': 'application/json' })
          .end(JSON.stringify({ logout_token: logoutToken }));
        return;
      }
      if (url.pathname.startsWith('/interaction/')) {
        const details = await provider.interactionDetails(req, res);
        let result;
        if (details.prompt.name === 'login') {
          const login = url.searchParams.get('login');
          if (!login || !USERS[login]) {
            res.writeHead(400, { 'content-type': 'text/plain' }).end('add ?login=USER');
            return;
          }
          result = { login: { accountId: login } };
        } else {
          result = { consent: {} };
        }
        await provider.interactionFinished(req, res, result, { mergeWithLastSubmission: false });
        return;
      }
      callback(req, res);
    } catch (err) {
      console.error('provider.mjs', err);
      res.writeHead(500).end(`${err}${err.cause ? `: ${err.cause}` : ''}`);
    }
  });
}

const main = await listen();
const other = await listen();
console.log(JSON.stringify({ main: main.issuer, other: other.issuer }));
const lines = readline.createInterface({ input: process.stdin });
let configured = false;
lines.on('line', (line) => {
  if (configured) return;
  const { redirect_uri: redirectUri } = JSON.parse(line);
  serve(main, redirectUri, true);
  serve(other, redirectUri, false);
  configured = true;
  console.log(JSON.stringify({ ready: true, now: Date.now() }));
});
lines.on('close', () => process.exit(0));
