// kafkajs' admin over SASL_SSL: create an ACL (WRITE for User:bob on a topic), describe it, delete it
// and describe again; prints one JSON object: what describe listed and what delete removed.
// Usage: node kafkajs_acls.js '{"broker": "...", "ca": "ca.pem", "user": "...", "password": "...", "topic": "..."}'
const fs = require('fs')
const { Kafka, logLevel, AclResourceTypes, AclOperationTypes, AclPermissionTypes, ResourcePatternTypes } =
  require('kafkajs')

const args = JSON.parse(process.argv[2])
const kafka = new Kafka({
  clientId: 'memq-acls', brokers: [args.broker], logLevel: logLevel.ERROR,
  ssl: { ca: [fs.readFileSync(args.ca, 'utf-8')] },
  sasl: { mechanism: 'plain', username: args.user, password: args.password },
})
const binding = {
  resourceType: AclResourceTypes.TOPIC, resourceName: args.topic, resourcePatternType: ResourcePatternTypes.LITERAL,
  principal: 'User:bob', host: '*', operation: AclOperationTypes.WRITE, permissionType: AclPermissionTypes.ALLOW,
}
const filter = { ...binding, operation: AclOperationTypes.ANY, permissionType: AclPermissionTypes.ANY }
const flat = (resources) => resources.flatMap((r) => r.acls.map((a) => [r.resourceName, a.principal, a.operation]))

async function main () {
  const admin = kafka.admin()
  await admin.connect()
  try {
    await admin.createAcls({ acl: [binding] })
    const described = flat((await admin.describeAcls(filter)).resources)
    const deleted = await admin.deleteAcls({ filters: [filter] })
    const removed = deleted.filterResponses.flatMap((f) => f.matchingAcls.map((a) => [a.resourceName, a.principal,
      a.operation]))
    const after = flat((await admin.describeAcls(filter)).resources)
    process.stdout.write(JSON.stringify({ described, removed, after }) + '\n')
  } finally {
    await admin.disconnect()
  }
}

main().catch((e) => { process.stderr.write(String(e && e.stack ? e.stack : e) + '\n'); process.exit(1) })
