// A real OAuth 2.1 authorization server (npm `oidc-provider`) that issues agents' access tokens
// for Countersign's `/mcp`: the client credentials grant with resource indicators (RFC 8707),
// JWT access tokens (RFC 9068, `typ: at+jwt`, `aud` = the resource).
//
//   node end2end/oidc/agents-as.mjs
//
// Starts two issuers on ephemeral loopback ports, each with its own freshly generated RSA key:
// `main` (the one Countersign trusts) and `other` (one it does not), and prints one JSON line:
// {"main": URL, "other": URL}. It then reads one JSON line from stdin, {"resource": URL} (the
// `/mcp` URL of the server under test, started once the issuer URL is known), prints
// {"ready": true} and serves until stdin closes (the test holds the pipe, so the server dies
// with it). Tokens are issued for that resource and for http://elsewhere.test/mcp (another
// resource server, for the wrong-audience case); any other resource is `invalid_target`.
//
// Clients (secret = id + "-secret", client_secret_basic, grant client_credentials only):
// `fin-agent` and `stranger` may ask for scope `mcp:tools`; `no-scope` only for `openid`.
//
// Test hook (both issuers): POST /__test__/sign {"claims": {...}, "mode": M} signs a token the
// way a broken or hostile issuer would and returns {"token": ...}: M = "rs256" (this issuer's
// key, the kid it publishes), "none" (unsigned, `alg: none`), "hs256-public" (HMAC-SHA256 keyed
// with the issuer's public key in PEM: the key-confusion attack), "unknown-kid" (a key the
// issuer never published). POST /__test__/rotate replaces the signing key (a new kid) and
// answers {"kid": ...}: tokens signed after it name a kid a verifier must fetch again.

import http from 'node:http';
import readline from 'node:readline';
import { createHmac, createPrivateKey, createPublicKey, generateKeyPairSync, sign } from 'node:crypto';
import Provider, { errors } from 'oidc-provider';

const ELSEWHERE = 'http://elsewhere.test/mcp';
const SCOPE = 'mcp:tools';

function signingKey(kid) {
  const { privateKey } = generateKeyPairSync('rsa', { modulusLength: 2048 });
  return { ...privateKey.export({ format: 'jwk' }), kid, use: 'sig', alg: 'RS256' };
}

const b64 = (value) => Buffer.from(typeof value === 'string' ? value : JSON.stringify(value)).toString('base64url');

function signed(claims, mode, jwk) {
  const header = { typ: 'at+jwt' };
  let key = jwk;
  if (mode === 'none') {
    return `${b64({ ...header, alg: 'none' })}.${b64(claims)}.`;
  }
  if (mode === 'hs256-public') {
    const pem = createPublicKey({ key: jwk, format: 'jwk' }).export({ type: 'spki', format: 'pem' });
    const input = `${b64({ ...header, alg: 'HS256', kid: jwk.kid })}.${b64(claims)}`;
    return `${input}.${createHmac('sha256', pem).update(input).digest('base64url')}`;
  }
  if (mode === 'unknown-kid') key = signingKey('never-published');
  const input = `${b64({ ...header, alg: 'RS256', kid: key.kid })}.${b64(claims)}`;
  const signature = sign('sha256', Buffer.from(input), createPrivateKey({ key, format: 'jwk' }));
  return `${input}.${signature.toString('base64url')}`;
}

async function readBody(req) {
  const chunks = [];
  for await (const chunk of req) chunks.push(chunk);
  return JSON.parse(Buffer.concat(chunks).toString() || '{}');
}

async function issuer(resources) {
  const server = http.createServer();
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  const url = `http://127.0.0.1:${server.address().port}`;
  const state = { jwk: signingKey('as-key-1'), rotations: 1, provider: null };
  const build = () => new Provider(url, {
    jwks: { keys: [state.jwk] },
    clients: ['fin-agent', 'stranger', 'no-scope'].map((id) => ({
      client_id: id,
      client_secret: `${id}-secret`,
      grant_types: ['client_credentials'],
      response_types: [],
      redirect_uris: [],
      token_endpoint_auth_method: 'client_secret_basic',
      scope: id === 'no-scope' ? 'openid' : SCOPE,
    })),
    scopes: ['openid', SCOPE],
    features: {
      devInteractions: { enabled: false },
      clientCredentials: { enabled: true },
      resourceIndicators: {
        enabled: true,
        defaultResource: async (ctx, client, oneOf) => oneOf ?? resources.value,
        useGrantedResource: async () => true,
        getResourceServerInfo: async (ctx, resource) => {
          if (resource !== resources.value && resource !== ELSEWHERE) throw new errors.InvalidTarget();
          return {
            scope: SCOPE,
            audience: resource,
            accessTokenTTL: 300,
            accessTokenFormat: 'jwt',
            jwt: { sign: { alg: 'RS256' } },
          };
        },
      },
    },
  });
  server.on('request', async (req, res) => {
    if (!resources.value) {
      res.writeHead(503).end();
      return;
    }
    if (req.method === 'POST' && req.url === '/__test__/sign') {
      const { claims, mode } = await readBody(req);
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(JSON.stringify({ token: signed(claims, mode ?? 'rs256', state.jwk) }));
      return;
    }
    if (req.method === 'POST' && req.url === '/__test__/rotate') {
      state.rotations += 1;
      state.jwk = signingKey(`as-key-${state.rotations}`);
      state.provider = build();
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(JSON.stringify({ kid: state.jwk.kid }));
      return;
    }
    state.provider ??= build();
    state.provider.callback()(req, res);
  });
  return url;
}

const resources = { value: null };
const main = await issuer(resources);
const other = await issuer(resources);
process.stdout.write(`${JSON.stringify({ main, other })}\n`);
const lines = readline.createInterface({ input: process.stdin });
lines.once('line', (line) => {
  resources.value = JSON.parse(line).resource;
  process.stdout.write(`${JSON.stringify({ ready: true })}\n`);
});
lines.on('close', () => process.exit(0));
