// oauth2-mock-server on 127.0.0.1 (port from argv[2], 0 for any). Prints one JSON line
// `{"issuer": URL}` when it listens, then one JSON line per token or revocation request,
// so a test can see what the client sent. `DROP_REFRESH_ON_REFRESH=1` leaves the refresh
// token out of refresh responses (RFC 6749 §6 allows that).
import { OAuth2Server } from 'oauth2-mock-server';

const server = new OAuth2Server();
await server.issuer.keys.generate('RS256');
const print = (line) => process.stdout.write(JSON.stringify(line) + '\n');

server.service.on('beforeResponse', (response, req) => {
  const body = req.body ?? {};
  print({
    event: 'token',
    grant_type: body.grant_type,
    resource: body.resource ?? null,
    client_auth: req.headers.authorization?.startsWith('Basic ') ? 'basic' : 'body',
  });
  if (body.grant_type === 'refresh_token' && process.env.DROP_REFRESH_ON_REFRESH === '1') {
    delete response.body.refresh_token;
  }
});

server.service.on('beforeRevoke', (_response, req) => {
  let raw = '';
  req.on('data', (chunk) => { raw += chunk; });
  req.on('end', () => {
    const form = new URLSearchParams(raw);
    print({
      event: 'revoke',
      token_type_hint: form.get('token_type_hint'),
      client_auth: req.headers.authorization?.startsWith('Basic ') ? 'basic' : 'body',
    });
  });
});

const port = Number(process.argv[2] ?? 0);
// The issuer is the address clients discover it at (the library would name `localhost`).
await server.start(port, '127.0.0.1');
server.issuer.url = `http://127.0.0.1:${server.address().port}`;
print({ issuer: server.issuer.url });
process.on('SIGTERM', () => server.stop().then(() => process.exit(0)));
