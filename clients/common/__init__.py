"""What both sides of the wire share: errors and codes, the record batch layout and its
validation, the limits both sides must agree on, topic rules, the partitioner, the ACL
model and the token format. The services import it, as Kafka's broker depends on the
clients' common package; it imports nothing from services/ or coordinator/."""
