package kip98.clients;

import static kip98.clients.Common.GUARD;
import static kip98.clients.Common.outcome;
import static kip98.clients.Common.readAll;
import static kip98.clients.Common.send;
import static kip98.clients.Json.obj;

import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Properties;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.OffsetSpec;
import org.apache.kafka.clients.admin.ListOffsetsOptions;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.IsolationLevel;
import org.apache.kafka.common.TopicPartition;

/** The idempotent and transactional producer: {@code Producers BOOTSTRAP SCENARIO ARGS...}.
 *
 * <ul>
 * <li>{@code transactions TOPIC FENCED_TOPIC TXID}: an idempotent producer's offsets; a
 *     committed, an aborted and a committed transaction as each isolation reads them; the
 *     older of two instances of one transactional id fenced.
 * <li>{@code send-offsets IN OUT GROUP TXID}: consume-transform-produce with
 *     sendOffsetsToTransaction and the consumer's group metadata; the consumer's committed()
 *     (requireStable under read_committed) while the offsets are pending and after.
 * <li>{@code timeout TOPIC TXID}: a transaction left open past its timeout, aborted by its
 *     coordinator; what the producer is told when it commits afterwards.
 * <li>{@code epochs TOPIC TXID}: three transactions (committed, aborted, committed) and the
 *     producer epoch DescribeTransactions gives after each, relative to the one after
 *     initTransactions: moved at every end on transaction version 2 (KIP-890), kept on 1.
 * </ul>
 */
public final class Producers {
    private Producers() {}

    public static void main(String[] args) throws Exception {
        String bootstrap = args[0];
        Map<String, Object> result = switch (args[1]) {
            case "transactions" -> transactions(bootstrap, args[2], args[3], args[4]);
            case "send-offsets" -> sendOffsets(bootstrap, args[2], args[3], args[4], args[5]);
            case "timeout" -> timeout(bootstrap, args[2], args[3]);
            case "epochs" -> epochs(bootstrap, args[2], args[3]);
            default -> throw new IllegalArgumentException("unknown scenario " + args[1]);
        };
        Common.emit(result);
    }

    static Map<String, Object> transactions(String bootstrap, String topic, String fencedTopic, String txid)
            throws Exception {
        List<Long> idempotentOffsets = new ArrayList<>();
        try (KafkaProducer<String, String> p = Common.producer(bootstrap, null)) {
            for (int i = 0; i < 3; i++) {
                RecordMetadata m = p.send(new ProducerRecord<>(topic, 0, "i" + i, "i" + i)).get();
                idempotentOffsets.add(m.offset());
            }
        }
        try (KafkaProducer<String, String> p = Common.producer(bootstrap, txid)) {
            p.initTransactions();
            p.beginTransaction();
            send(p, topic, "c1", "c2");
            p.commitTransaction();
            p.beginTransaction();
            send(p, topic, "a1");
            p.abortTransaction();
            p.beginTransaction();
            send(p, topic, "c3");
            p.commitTransaction();
        }
        // The older of two instances of one transactional id is fenced when the newer
        // initialises: its open transaction is aborted, its commit refused.
        String fencedId = txid + "-fenced";
        KafkaProducer<String, String> older = Common.producer(bootstrap, fencedId);
        older.initTransactions();
        older.beginTransaction();
        send(older, fencedTopic, "old");
        String olderCommit;
        String olderSend;
        try (KafkaProducer<String, String> newer = Common.producer(bootstrap, fencedId)) {
            newer.initTransactions();
            olderSend = outcome(() -> older.send(new ProducerRecord<>(fencedTopic, 0, "late", "late")).get());
            olderCommit = outcome(older::commitTransaction);
            newer.beginTransaction();
            send(newer, fencedTopic, "new");
            newer.commitTransaction();
        } finally {
            older.close(Duration.ZERO);
        }
        return obj(
            "idempotent_offsets", idempotentOffsets,
            "read_committed", readAll(bootstrap, topic, true),
            "read_uncommitted", readAll(bootstrap, topic, false),
            "fenced_send", olderSend,
            "fenced_commit", olderCommit,
            "fenced_topic_read_committed", readAll(bootstrap, fencedTopic, true));
    }

    static Map<String, Object> sendOffsets(String bootstrap, String in, String out, String group, String txid)
            throws Exception {
        try (KafkaProducer<String, String> p = Common.producer(bootstrap, null)) {
            send(p, in, "x", "y", "z");
        }
        TopicPartition inTp = new TopicPartition(in, 0);
        Map<String, Object> result;
        try (KafkaConsumer<String, String> c = Common.consumer(bootstrap, group, true);
             KafkaProducer<String, String> p = Common.producer(bootstrap, txid)) {
            p.initTransactions();
            c.subscribe(List.of(in));
            List<String> seen = new ArrayList<>();
            long deadline = System.nanoTime() + GUARD.toNanos();
            while (seen.size() < 3 && System.nanoTime() < deadline) {
                ConsumerRecords<String, String> records = c.poll(Duration.ofMillis(200));
                records.forEach(r -> seen.add(r.value()));
            }
            p.beginTransaction();
            for (String v : seen) {
                p.send(new ProducerRecord<>(out, 0, v, v.toUpperCase()));
            }
            p.sendOffsetsToTransaction(Map.of(inTp, new OffsetAndMetadata(3, "meta")), c.groupMetadata());
            p.flush();
            // requireStable: the pending transactional commit is not answered until it ends,
            // so the consumer's committed() keeps asking until its own timeout.
            String pending = outcome(() -> c.committed(java.util.Set.of(inTp), Duration.ofSeconds(2)));
            p.commitTransaction();
            OffsetAndMetadata after = c.committed(java.util.Set.of(inTp), GUARD).get(inTp);
            result = obj(
                "consumed", seen,
                "committed_while_pending", pending,
                "committed_after", after == null ? null : List.of(after.offset(), after.metadata()));
        }
        result.put("out_read_committed", readAll(bootstrap, out, true));
        return result;
    }

    static Map<String, Object> timeout(String bootstrap, String topic, String txid) throws Exception {
        Properties config = Common.producerConfig(bootstrap, txid);
        config.put(ProducerConfig.TRANSACTION_TIMEOUT_CONFIG, "2000");
        TopicPartition tp = new TopicPartition(topic, 0);
        try (KafkaProducer<String, String> p = new KafkaProducer<>(config); Admin admin = Common.admin(bootstrap)) {
            p.initTransactions();
            p.beginTransaction();
            send(p, topic, "t1", "t2");
            long hw = latest(admin, tp, IsolationLevel.READ_UNCOMMITTED);
            long lsoOpen = latest(admin, tp, IsolationLevel.READ_COMMITTED);
            // The coordinator aborts the transaction once it is older than its timeout:
            // the abort marker lifts the LSO to the high watermark.
            Common.waitUntil("aborted by the coordinator", () -> {
                try {
                    long lso = latest(admin, tp, IsolationLevel.READ_COMMITTED);
                    return lso == latest(admin, tp, IsolationLevel.READ_UNCOMMITTED) && lso > hw;
                } catch (Exception e) {
                    throw new IllegalStateException(e);
                }
            });
            String commit = outcome(p::commitTransaction);
            return obj(
                "lso_while_open", lsoOpen,
                "hw_while_open", hw,
                "commit_after_timeout", commit,
                "read_committed", readAll(bootstrap, topic, true));
        }
    }

    static Map<String, Object> epochs(String bootstrap, String topic, String txid) throws Exception {
        List<Integer> epochs = new ArrayList<>();
        List<String> states = new ArrayList<>();
        try (KafkaProducer<String, String> p = Common.producer(bootstrap, txid); Admin admin = Common.admin(bootstrap)) {
            p.initTransactions();
            int first = admin.describeTransactions(List.of(txid)).description(txid).get().producerEpoch();
            String[][] rounds = {{"c1", "commit"}, {"a1", "abort"}, {"c2", "commit"}};
            for (String[] round : rounds) {
                p.beginTransaction();
                send(p, topic, round[0]);
                if (round[1].equals("commit")) {
                    p.commitTransaction();
                } else {
                    p.abortTransaction();
                }
                var described = admin.describeTransactions(List.of(txid)).description(txid).get();
                epochs.add(described.producerEpoch() - first);
                // PrepareCommit or CompleteCommit: Kafka writes the markers after it answers.
                states.add(described.state().toString().toLowerCase().contains("commit") ? "commit" : "abort");
            }
        }
        return obj("epochs_after_each_end", epochs, "states", states, "read_committed", readAll(bootstrap, topic, true));
    }

    static long latest(Admin admin, TopicPartition tp, IsolationLevel isolation) throws Exception {
        return admin.listOffsets(Map.of(tp, OffsetSpec.latest()), new ListOffsetsOptions(isolation))
            .partitionResult(tp).get().offset();
    }
}
