// A real OpenID Connect provider (panva's certified oidc-provider) for raypod's single sign-on tests.
//
// Configured by environment: PORT, ISSUER, CLIENT_ID, CLIENT_SECRET, REDIRECT_URI, BACKCHANNEL_LOGOUT_URI,
// ACCOUNTS_FILE (JSON {login: {groups: [...], email, name}}, read at every login and token refresh, so a test
// changes someone's groups by rewriting it) and JWKS_FILE (JSON {keys: [private JWKs]}, the first signs: a test
// rotates keys by restarting the provider with another file). Its development login form takes any password.
import fs from 'node:fs';
import Provider from 'oidc-provider';

const env = process.env;
const accounts = () => JSON.parse(fs.readFileSync(env.ACCOUNTS_FILE, 'utf8'));

const configuration = {
  clients: [{
    client_id: env.CLIENT_ID,
    client_secret: env.CLIENT_SECRET,
    redirect_uris: [env.REDIRECT_URI],
    post_logout_redirect_uris: [env.REDIRECT_URI.replace(/\/login\/sso\/callback$/, '/login')],
    grant_types: ['authorization_code', 'refresh_token', 'urn:ietf:params:oauth:grant-type:device_code'],
    response_types: ['code'],
    token_endpoint_auth_method: 'client_secret_basic',
    backchannel_logout_uri: env.BACKCHANNEL_LOGOUT_URI,
    backchannel_logout_session_required: true,
  }],
  jwks: JSON.parse(fs.readFileSync(env.JWKS_FILE, 'utf8')),
  claims: {
    openid: ['sub'],
    profile: ['preferred_username', 'name'],
    email: ['email'],
    groups: ['groups'],
  },
  scopes: ['openid', 'offline_access', 'profile', 'email', 'groups'],
  conformIdTokenClaims: false, // the ID token carries the scopes' claims (groups), as Okta/Entra/Keycloak can
  features: {
    devInteractions: { enabled: true },
    deviceFlow: { enabled: true },
    backchannelLogout: { enabled: true },
    revocation: { enabled: true },
  },
  pkce: { required: () => true },
  issueRefreshToken: async (ctx, client, code) => client.grantTypeAllowed('refresh_token'),
  async loadExistingGrant(ctx) { // consent once given is not asked again (Okta/Entra's first-party apps)
    const grantId = ctx.oidc.result?.consent?.grantId || ctx.oidc.session.grantIdFor(ctx.oidc.client.clientId);
    if (grantId) return ctx.oidc.provider.Grant.find(grantId);
    const grant = new ctx.oidc.provider.Grant({ clientId: ctx.oidc.client.clientId, accountId: ctx.oidc.session.accountId });
    grant.addOIDCScope('openid offline_access profile email groups');
    await grant.save();
    return grant;
  },
  async findAccount(ctx, id) {
    const account = accounts()[id];
    if (!account) return undefined;
    return {
      accountId: id,
      async claims() {
        const now = accounts()[id] || { groups: [] };
        return { sub: id, preferred_username: id, name: now.name || id, email: now.email || `${id}@example.com`, groups: now.groups || [] };
      },
    };
  },
  // Its outgoing calls (back-channel logout) refuse loopback addresses, where raypod runs in the tests: this test
  // provider alone drops that guard.
  fetch: (url, options) => { delete options.dispatcher; return fetch(url, options); },
  ttl: { IdToken: 3600, AccessToken: 3600, RefreshToken: 86400, DeviceCode: 600, Session: 86400, Interaction: 600, Grant: 86400 },
};

const provider = new Provider(env.ISSUER, configuration);
provider.proxy = false;
provider.on('backchannel.error', (ctx, err, client) => console.log(`backchannel logout to ${client.clientId} failed: ${err} ${err.cause}`));
provider.on('backchannel.success', (ctx, client) => console.log(`backchannel logout to ${client.clientId} sent`));
provider.on('server_error', (ctx, err) => console.log(`server error: ${err}`));
provider.listen(Number(env.PORT), '127.0.0.1', () => console.log(`oidc-provider listening on ${env.ISSUER}`));
