package kip98.clients;

import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.ExecutionException;
import java.util.function.BooleanSupplier;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;

/** What the programs share: client configurations that work against kip98 and Kafka alike
 * (docs/clients.md), reading a partition to its end, and errors by their class name. */
public final class Common {
    private Common() {}

    /** A hang guard for every wait: generous, as the tests never assert a speed. */
    public static final Duration GUARD = Duration.ofSeconds(60);

    public static Properties producerConfig(String bootstrap, String transactionalId) {
        Properties p = new Properties();
        p.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        p.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        p.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, "true");
        p.put(ProducerConfig.ACKS_CONFIG, "all");
        p.put(ProducerConfig.LINGER_MS_CONFIG, "0");
        if (transactionalId != null) {
            p.put(ProducerConfig.TRANSACTIONAL_ID_CONFIG, transactionalId);
        }
        return p;
    }

    public static KafkaProducer<String, String> producer(String bootstrap, String transactionalId) {
        return new KafkaProducer<>(producerConfig(bootstrap, transactionalId));
    }

    public static Properties consumerConfig(String bootstrap, String group, boolean readCommitted) {
        Properties p = new Properties();
        p.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
        p.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
        p.put(ConsumerConfig.ISOLATION_LEVEL_CONFIG, readCommitted ? "read_committed" : "read_uncommitted");
        p.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
        p.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        if (group != null) {
            p.put(ConsumerConfig.GROUP_ID_CONFIG, group);
        }
        return p;
    }

    public static KafkaConsumer<String, String> consumer(String bootstrap, String group, boolean readCommitted) {
        return new KafkaConsumer<>(consumerConfig(bootstrap, group, readCommitted));
    }

    public static Admin admin(String bootstrap) {
        Properties p = new Properties();
        p.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        return Admin.create(p);
    }

    public static void send(KafkaProducer<String, String> producer, String topic, String... values) {
        for (String v : values) {
            producer.send(new ProducerRecord<>(topic, 0, v, v));
        }
        producer.flush();
    }

    /** The values a consumer of this isolation reads from partition 0 of ``topic``, from its
     * start up to its end offset, each as [offset, value]. Under read_committed, once the
     * LSO has reached the high watermark: a broker writes a transaction's markers after its
     * EndTxn answers (Kafka does so asynchronously), and every caller reads a partition
     * whose transactions have all ended. */
    public static List<List<Object>> readAll(String bootstrap, String topic, boolean readCommitted)
            throws InterruptedException {
        TopicPartition tp = new TopicPartition(topic, 0);
        try (KafkaConsumer<String, String> c = consumer(bootstrap, null, readCommitted);
             KafkaConsumer<String, String> hw = consumer(bootstrap, null, false)) {
            c.assign(List.of(tp));
            c.seekToBeginning(List.of(tp));
            if (readCommitted) {
                waitUntil("the LSO at the high watermark of " + tp, () ->
                    c.endOffsets(List.of(tp)).get(tp).equals(hw.endOffsets(List.of(tp)).get(tp)));
            }
            return pollTo(c, tp, c.endOffsets(List.of(tp)).get(tp));
        }
    }

    /** What ``c`` reads of ``tp`` from its position up to ``end``, each as [offset, value]. */
    public static List<List<Object>> pollTo(KafkaConsumer<String, String> c, TopicPartition tp, long end) {
        List<List<Object>> out = new ArrayList<>();
        long deadline = System.nanoTime() + GUARD.toNanos();
        while (c.position(tp) < end) {
            if (System.nanoTime() > deadline) {
                throw new IllegalStateException("not at " + end + " of " + tp + " within the guard");
            }
            for (ConsumerRecord<String, String> r : c.poll(Duration.ofMillis(200))) {
                out.add(List.of(r.offset(), r.value()));
            }
        }
        return out;
    }

    /** An error's name: the exception's class, the cause's for a future's failure. */
    public static String error(Throwable e) {
        Throwable t = e;
        while ((t instanceof ExecutionException || t instanceof org.apache.kafka.common.KafkaException
                && t.getClass() == org.apache.kafka.common.KafkaException.class) && t.getCause() != null) {
            t = t.getCause();
        }
        return t.getClass().getSimpleName();
    }

    /** Runs ``step``: "ok", or its error's name. */
    public static String outcome(Step step) {
        try {
            step.run();
            return "ok";
        } catch (Exception e) {
            return error(e);
        }
    }

    public interface Step {
        void run() throws Exception;
    }

    public static void waitUntil(String what, BooleanSupplier condition) throws InterruptedException {
        long deadline = System.nanoTime() + GUARD.toNanos();
        while (!condition.getAsBoolean()) {
            if (System.nanoTime() > deadline) {
                throw new IllegalStateException("not " + what + " within the guard");
            }
            Thread.sleep(100);
        }
    }

    /** Prints the program's one result line. */
    public static void emit(Map<String, Object> result) {
        System.out.println(Json.write(result));
        System.out.flush();
    }
}
