package kip98.clients;

import static kip98.clients.Common.GUARD;
import static kip98.clients.Common.pollTo;
import static kip98.clients.Common.send;
import static kip98.clients.Json.obj;

import java.time.Duration;
import java.util.List;
import java.util.Map;

import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.common.TopicPartition;

/** The read_committed consumer: {@code Consumers BOOTSTRAP SCENARIO ARGS...}.
 *
 * <ul>
 * <li>{@code read-committed TOPIC TXID}: a committed, an aborted and an open transaction;
 *     what endOffsets, seekToEnd and poll give each isolation while one is open, and after
 *     it commits.
 * </ul>
 */
public final class Consumers {
    private Consumers() {}

    public static void main(String[] args) throws Exception {
        String bootstrap = args[0];
        Map<String, Object> result = switch (args[1]) {
            case "read-committed" -> readCommitted(bootstrap, args[2], args[3]);
            default -> throw new IllegalArgumentException("unknown scenario " + args[1]);
        };
        Common.emit(result);
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
