package kip98.clients;

import static kip98.clients.Common.GUARD;
import static kip98.clients.Common.pollTo;
import static kip98.clients.Common.send;
import static kip98.clients.Json.obj;

import java.time.Duration;
import java.util.Collection;
import java.util.List;
import java.util.Map;

import org.apache.kafka.clients.consumer.ConsumerRebalanceListener;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.common.TopicPartition;

/** The read_committed consumer: {@code Consumers BOOTSTRAP SCENARIO ARGS...}.
 *
 * <ul>
 * <li>{@code read-committed TOPIC TXID}: a committed, an aborted and an open transaction;
 *     what endOffsets, seekToEnd and poll give each isolation while one is open, and after
 *     it commits.
 * <li>{@code group-protocol TOPIC GROUP TXID}: two consumers of {@code group.protocol=consumer}
 *     (KIP-848) share a two-partition topic, committing after each poll and before a
 *     partition is revoked; one leaves and the other ends with both partitions, each record
 *     read once.
 * </ul>
 */
public final class Consumers {
    private Consumers() {}

    public static void main(String[] args) throws Exception {
        String bootstrap = args[0];
        Map<String, Object> result = switch (args[1]) {
            case "read-committed" -> readCommitted(bootstrap, args[2], args[3]);
            case "group-protocol" -> groupProtocol(bootstrap, args[2], args[3], args[4]);
            default -> throw new IllegalArgumentException("unknown scenario " + args[1]);
        };
        Common.emit(result);
    }

    static Map<String, Object> groupProtocol(String bootstrap, String topic, String group, String txid)
            throws Exception {
        java.util.Properties config = Common.consumerConfig(bootstrap, group, true);
        config.put("group.protocol", "consumer");
        List<String> read = new java.util.ArrayList<>();
        java.util.Set<Integer> sharedAt = new java.util.TreeSet<>();
        int afterLeave;
        try (KafkaProducer<String, String> p = Common.producer(bootstrap, txid);
             KafkaConsumer<String, String> one = new KafkaConsumer<>(config);
             KafkaConsumer<String, String> two = new KafkaConsumer<>(config)) {
            p.initTransactions();
            p.beginTransaction();
            for (int i = 0; i < 6; i++) {
                p.send(new org.apache.kafka.clients.producer.ProducerRecord<>(topic, i % 2, "k" + i, "v" + i));
            }
            p.commitTransaction();
            one.subscribe(List.of(topic), committingOnRevocation(one));
            two.subscribe(List.of(topic), committingOnRevocation(two));
            long deadline = System.nanoTime() + GUARD.toNanos();
            while (read.size() < 6 || one.assignment().isEmpty() || two.assignment().isEmpty()) {
                if (System.nanoTime() > deadline) {
                    throw new IllegalStateException("the group did not settle within the guard: " + read);
                }
                for (KafkaConsumer<String, String> c : List.of(one, two)) {
                    for (org.apache.kafka.clients.consumer.ConsumerRecord<String, String> r : c.poll(Duration.ofMillis(100))) {
                        read.add(r.value());
                    }
                    c.commitSync();
                }
                for (TopicPartition tp : one.assignment()) {
                    if (two.assignment().contains(tp)) {
                        sharedAt.add(tp.partition());
                    }
                }
            }
            one.close();
            deadline = System.nanoTime() + GUARD.toNanos();
            while (two.assignment().size() < 2) {
                if (System.nanoTime() > deadline) {
                    throw new IllegalStateException("the leaver's partitions did not move within the guard");
                }
                for (org.apache.kafka.clients.consumer.ConsumerRecord<String, String> r : two.poll(Duration.ofMillis(100))) {
                    read.add(r.value());
                }
            }
            afterLeave = two.assignment().size();
        }
        java.util.Collections.sort(read);
        return obj("read", read, "partitions_held_by_both", List.copyOf(sharedAt),
                   "partitions_after_leave", afterLeave);
    }

    /** Commits what {@code c} has read before a partition leaves it. With no listener, the
     * KIP-848 consumer completes a revocation in its background thread, which may fall
     * between a poll that returned the partition's records and the commitSync after it:
     * the partition would move uncommitted and its next owner read those records again.
     * A listener's callback runs in poll, so the revocation waits for it. */
    static ConsumerRebalanceListener committingOnRevocation(KafkaConsumer<String, String> c) {
        return new ConsumerRebalanceListener() {
            @Override
            public void onPartitionsRevoked(Collection<TopicPartition> partitions) {
                if (!partitions.isEmpty()) {
                    c.commitSync();
                }
            }

            @Override
            public void onPartitionsAssigned(Collection<TopicPartition> partitions) {}
        };
    }

    static Map<String, Object> readCommitted(String bootstrap, String topic, String txid) throws Exception {
        TopicPartition tp = new TopicPartition(topic, 0);
        Map<String, Object> result;
        try (KafkaProducer<String, String> p = Common.producer(bootstrap, txid);
             KafkaConsumer<String, String> committed = Common.consumer(bootstrap, null, true);
             KafkaConsumer<String, String> uncommitted = Common.consumer(bootstrap, null, false)) {
            p.initTransactions();
            p.beginTransaction();
            send(p, topic, "a", "b");
            p.commitTransaction();
            p.beginTransaction();
            send(p, topic, "aborted");
            p.abortTransaction();
            committed.assign(List.of(tp));
            uncommitted.assign(List.of(tp));
            // Kafka answers EndTxn once the outcome is decided and writes its markers after:
            // the next transaction starts once the abort's marker is in (the LSO at the end).
            settled(committed, uncommitted, tp);
            p.beginTransaction();
            send(p, topic, "open");
            long lso = committed.endOffsets(List.of(tp)).get(tp);
            long hw = uncommitted.endOffsets(List.of(tp)).get(tp);
            committed.seekToEnd(List.of(tp));
            long endPosition = committed.position(tp);
            committed.seekToBeginning(List.of(tp));
            List<List<Object>> whileOpen = pollTo(committed, tp, lso);
            // Nothing past the LSO while the transaction is open: one more poll returns none.
            int beyond = committed.poll(Duration.ofMillis(500)).count();
            p.commitTransaction();
            long lsoAfter = settled(committed, uncommitted, tp);
            List<List<Object>> afterCommit = pollTo(committed, tp, lsoAfter);
            uncommitted.seekToBeginning(List.of(tp));
            result = obj(
                "lso_while_open", lso,
                "hw_while_open", hw,
                "seek_to_end_while_open", endPosition,
                "read_committed_while_open", whileOpen,
                "records_beyond_lso", beyond,
                "lso_after_commit", lsoAfter,
                "read_committed_after_commit", afterCommit,
                "read_uncommitted", pollTo(uncommitted, tp, lsoAfter));
        }
        return result;
    }

    /** The LSO once it has reached the high watermark: no transaction open on ``tp``, its
     * last marker written. */
    static long settled(
            KafkaConsumer<String, String> committed, KafkaConsumer<String, String> uncommitted,
            TopicPartition tp) throws InterruptedException {
        long deadline = System.nanoTime() + GUARD.toNanos();
        while (true) {
            long lso = committed.endOffsets(List.of(tp)).get(tp);
            if (lso == uncommitted.endOffsets(List.of(tp)).get(tp)) {
                return lso;
            }
            if (System.nanoTime() > deadline) {
                throw new IllegalStateException("the LSO of " + tp + " never reached its end");
            }
            Thread.sleep(20);
        }
    }
}
